#pragma once
// Supervised fine-tuning examples (issue 28): one JSON object -> its token ids and which of them are answer
// tokens (the loss counts the predictions OF answer tokens: data/sft_dataset.h shifts the mask onto labels).
// Two shapes of object, as NeMo's SFT data takes them:
//
//   {"input": ..., "output": ...}   NeMo's SFT format. Followed: NeMo nemo/collections/llm/gpt/data/core.py
//       GPTSFTDataset with create_sft_dataset's defaults (prompt_template "{input} {output}", add_bos false,
//       add_eos true, answer_only_loss true; each template piece tokenized on its own):
//         [bos, with prepend_bos] + ids(input) + ids(" ") + ids(output) + [eod]
//       answer tokens: ids(output) and the eod after it.
//   {"messages": [{"role": ..., "content": ...}, ...]}   a chat: an optional "system" message first, then
//       "user" and "assistant" messages alternating, starting with "user" and ending with "assistant".
//       Every content is trimmed of surrounding whitespace (the templates' `| trim`). Templates:
//         llama3 (a tokenizer with Llama 3's specials): Hugging Face's Meta-Llama-3-8B-Instruct chat template
//           (= meta-llama/llama3 llama/tokenizer.py ChatFormat; no default system message, unlike 3.1's):
//             <|begin_of_text|> then per message
//             <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//         plain (the byte tokenizer, which has no header tokens): the same structure in plain text,
//             <|begin_of_text|> then per message "<|ROLE|>\n" + CONTENT + "\n", except that an assistant
//             message ends with the eod token instead of "\n" (the byte tokenizer's only end token).
//       answer tokens: every assistant message's content and the end-of-turn token after it. (NeMo 2's
//       chat path counts every token unless the template marks the assistant's with {% generation %}; the
//       issue asks for answers only.)
// Special-token strings inside texts become their ids (the tokenizers' rule, as Hugging Face's).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pl::data {

class Tokenizer;

enum class ChatTemplate { llama3, plain };
// llama3 when the tokenizer has <|start_header_id|>, <|end_header_id|> and <|eot_id|>, else plain.
ChatTemplate chat_template_for(const Tokenizer& tok);
const char* chat_template_name(ChatTemplate t);  // "llama3" | "plain"

struct SftExample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> answer;  // answer[t] = 1: token t belongs to an answer (its prediction is trained)
  bool chat = false;            // the "messages" shape
  // input/output: tokens [input_begin, input_end) are ids(input), the part NeMo truncates first
  // (truncation_field "input"); -1 for a chat.
  int64_t input_begin = -1, input_end = -1;
  int64_t answer_tokens() const;
};

// One object of either shape. A malformed object (a missing or non-string field, an empty answer, roles out of
// order, an unknown role) is a pl::Error of one line without a location (the caller adds FILE:LINE).
SftExample encode_sft_example(const nlohmann::json& object, const Tokenizer& tok, bool prepend_bos);

// An example longer than max_tokens, shortened as NeMo's GPTSFTDataset._multiple_truncation does with its
// defaults (truncation_field "input", truncation_method "right"): first the end of ids(input) goes, then, if that
// is not enough (and always for a chat, which has no input field), the end of the example. Returns false when
// the example was not longer than max_tokens.
bool truncate_sft_example(SftExample& e, int64_t max_tokens);

struct ChatMessage {
  std::string role, content;
};
// A prompt for generation: the messages (trimmed, in the template of `tok`), then the assistant's header
// ("<|start_header_id|>assistant<|end_header_id|>\n\n" | "<|assistant|>\n") for the model to complete.
std::vector<int32_t> chat_prompt(std::span<const ChatMessage> messages, const Tokenizer& tok);

// The ids that end an answer: llama3: <|end_of_text|>, <|eom_id|>, <|eot_id|> (Llama 3.1 Instruct's
// generation_config eos_token_id [128001, 128008, 128009]); plain: the eod.
std::vector<int32_t> answer_stop_ids(const Tokenizer& tok);

}  // namespace pl::data
