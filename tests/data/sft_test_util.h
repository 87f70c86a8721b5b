#pragma once
// An SFT dataset written from JSON objects with the byte tokenizer (data/sft_dataset.h), for the tests of the
// data, the model and the GPU: the set's prefix in `dir`, and each example as encoded.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "data/sft_dataset.h"
#include "data/sft_format.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"
#include "io/atomic_file.h"

namespace pl::test {

inline std::string write_sft_set(const std::filesystem::path& dir, const std::vector<nlohmann::json>& objects,
                                 std::vector<data::SftExample>* examples = nullptr) {
  const std::string prefix = (dir / "sft").string();
  const auto tok = data::make_tokenizer("byte", "");
  data::TokenizerRecord rec;
  rec.type = "byte";
  rec.vocab_size = tok->vocab_size();
  rec.eod = tok->eod();
  rec.bos = tok->bos();
  FileSet set({data::indexed_dataset_journal_path(prefix)});
  data::SftDatasetWriter w(prefix, rec, set);
  for (const nlohmann::json& j : objects) {
    const data::SftExample e = data::encode_sft_example(j, *tok, false);
    w.add(e);
    if (examples != nullptr) examples->push_back(e);
  }
  data::SftRecord r;
  r.chat_template = "plain";
  w.finalize(r);
  set.publish();
  return prefix;
}

}  // namespace pl::test
