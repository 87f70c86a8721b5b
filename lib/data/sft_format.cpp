// SFT example encoding and the chat templates (see sft_format.h for the formats and their sources).
#include "data/sft_format.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string_view>

#include "core/error.h"
#include "data/tokenizer.h"

namespace pl::data {

namespace {

constexpr const char* kStartHeader = "<|start_header_id|>";
constexpr const char* kEndHeader = "<|end_header_id|>";
constexpr const char* kEndOfTurn = "<|eot_id|>";
constexpr const char* kEndOfMessage = "<|eom_id|>";

// Python's str.strip() on ASCII whitespace (the templates' `| trim`).
std::string_view trimmed(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) + 1 - b);
}

// The tokens of one example being built, with the answer flag of each.
struct Builder {
  SftExample e;
  void add(std::span<const int32_t> ids, bool answer) {
    e.tokens.insert(e.tokens.end(), ids.begin(), ids.end());
    e.answer.insert(e.answer.end(), ids.size(), answer ? 1 : 0);
  }
  void add(int32_t id, bool answer) { add(std::span<const int32_t>(&id, 1), answer); }
};

// The string under `key` of `j`, or a one-line error naming the key (and `where`, e.g. "message 2").
const std::string& string_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  PL_CHECK(it != j.end(), "{}key '{}' is missing", where, key);
  PL_CHECK(it->is_string(), "{}key '{}' is a {}, expected a string", where, key, it->type_name());
  return it->get_ref<const std::string&>();
}

SftExample encode_input_output(const nlohmann::json& j, const Tokenizer& tok, bool prepend_bos) {
  const std::string& input = string_field(j, "input", "");
  const std::string& output = string_field(j, "output", "");
  PL_CHECK(!trimmed(output).empty(), "empty answer: 'output' has no text");
  Builder b;
  if (prepend_bos) b.add(tok.bos(), false);
  b.e.input_begin = static_cast<int64_t>(b.e.tokens.size());
  b.add(tok.encode(input), false);
  b.e.input_end = static_cast<int64_t>(b.e.tokens.size());
  b.add(tok.encode(" "), false);
  b.add(tok.encode(output), true);
  b.add(tok.eod(), true);
  return std::move(b.e);
}

// The role of message i must be `want`; one line naming what came instead.
void check_role(const std::string& role, const char* want, size_t i) {
  PL_CHECK(role == want, "message {}: role '{}' where '{}' was expected (an optional 'system' message, then 'user' "
                         "and 'assistant' alternating, ending with 'assistant')",
           i + 1, role, want);
}

// The header of a message and what ends it, in the template of `tok`.
void add_header(Builder& b, ChatTemplate t, const Tokenizer& tok, const std::string& role) {
  if (t == ChatTemplate::llama3) {
    b.add(tok.special_id(kStartHeader), false);
    b.add(tok.encode(role), false);
    b.add(tok.special_id(kEndHeader), false);
    b.add(tok.encode("\n\n"), false);
  } else {
    b.add(tok.encode("<|" + role + "|>\n"), false);
  }
}
void add_message(Builder& b, ChatTemplate t, const Tokenizer& tok, const ChatMessage& m) {
  const bool answer = m.role == "assistant";
  add_header(b, t, tok, m.role);
  b.add(tok.encode(trimmed(m.content)), answer);
  if (t == ChatTemplate::llama3) b.add(tok.special_id(kEndOfTurn), answer);
  else if (answer) b.add(tok.eod(), true);
  else b.add(tok.encode("\n"), false);
}

std::vector<ChatMessage> read_messages(const nlohmann::json& j) {
  const auto it = j.find("messages");
  PL_CHECK(it->is_array(), "key 'messages' is a {}, expected an array of {{\"role\", \"content\"}} objects",
           it->type_name());
  PL_CHECK(!it->empty(), "'messages' is empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& m = (*it)[i];
    const std::string where = fmt::format("message {}: ", i + 1);
    PL_CHECK(m.is_object(), "{}a {}, expected an object with 'role' and 'content'", where, m.type_name());
    out.push_back({string_field(m, "role", where), string_field(m, "content", where)});
  }
  return out;
}

SftExample encode_chat(const nlohmann::json& j, const Tokenizer& tok) {
  const std::vector<ChatMessage> msgs = read_messages(j);
  size_t first = 0;
  if (msgs[0].role == "system") first = 1;
  PL_CHECK(msgs.size() > first, "the chat has a system message and nothing else");
  for (size_t i = first; i < msgs.size(); ++i) {
    const std::string& r = msgs[i].role;
    PL_CHECK(r == "system" || r == "user" || r == "assistant",
             "message {}: unknown role '{}' (system, user or assistant)", i + 1, r);
    check_role(r, (i - first) % 2 == 0 ? "user" : "assistant", i);
    PL_CHECK(r != "assistant" || !trimmed(msgs[i].content).empty(), "message {}: empty answer (an assistant "
             "message with no text)", i + 1);
  }
  PL_CHECK(msgs.back().role == "assistant", "message {}: the chat ends with '{}', not with an 'assistant' answer",
           msgs.size(), msgs.back().role);
  const ChatTemplate t = chat_template_for(tok);
  Builder b;
  b.e.chat = true;
  b.add(tok.bos(), false);
  for (const ChatMessage& m : msgs) add_message(b, t, tok, m);
  return std::move(b.e);
}

}  // namespace

ChatTemplate chat_template_for(const Tokenizer& tok) {
  const bool llama3 = tok.special_id(kStartHeader) >= 0 && tok.special_id(kEndHeader) >= 0 &&
                      tok.special_id(kEndOfTurn) >= 0;
  return llama3 ? ChatTemplate::llama3 : ChatTemplate::plain;
}

const char* chat_template_name(ChatTemplate t) { return t == ChatTemplate::llama3 ? "llama3" : "plain"; }

int64_t SftExample::answer_tokens() const {
  return std::count(answer.begin(), answer.end(), uint8_t{1});
}

SftExample encode_sft_example(const nlohmann::json& object, const Tokenizer& tok, bool prepend_bos) {
  PL_CHECK(object.is_object(), "expected a JSON object, found a {}", object.type_name());
  const bool chat = object.contains("messages");
  const bool io = object.contains("input") || object.contains("output");
  PL_CHECK(!(chat && io), "the object has both 'messages' and 'input'/'output': one shape per example");
  PL_CHECK(chat || io, "expected the keys 'input' and 'output', or 'messages'");
  return chat ? encode_chat(object, tok) : encode_input_output(object, tok, prepend_bos);
}

bool truncate_sft_example(SftExample& e, int64_t max_tokens) {
  PL_CHECK(max_tokens > 0, "internal: truncation to {} tokens", max_tokens);
  const auto n = static_cast<int64_t>(e.tokens.size());
  if (n <= max_tokens) return false;
  int64_t excess = n - max_tokens;
  if (e.input_end > e.input_begin) {  // the end of ids(input) first
    const int64_t cut = std::min(excess, e.input_end - e.input_begin);
    e.tokens.erase(e.tokens.begin() + (e.input_end - cut), e.tokens.begin() + e.input_end);
    e.answer.erase(e.answer.begin() + (e.input_end - cut), e.answer.begin() + e.input_end);
    e.input_end -= cut;
    excess -= cut;
  }
  e.tokens.resize(e.tokens.size() - static_cast<size_t>(excess));  // then the end of the example
  e.answer.resize(e.tokens.size());
  return true;
}

std::vector<int32_t> chat_prompt(std::span<const ChatMessage> messages, const Tokenizer& tok) {
  const ChatTemplate t = chat_template_for(tok);
  Builder b;
  b.add(tok.bos(), false);
  for (const ChatMessage& m : messages) add_message(b, t, tok, m);
  add_header(b, t, tok, "assistant");
  return std::move(b.e.tokens);
}

std::vector<int32_t> answer_stop_ids(const Tokenizer& tok) {
  if (chat_template_for(tok) == ChatTemplate::plain) return {tok.eod()};
  return {tok.eod(), tok.special_id(kEndOfMessage), tok.special_id(kEndOfTurn)};
}

}  // namespace pl::data
