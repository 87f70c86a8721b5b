// Checkpoints in process: the checksum, and save -> fresh model -> verify -> restore -> continue
// reproducing an uninterrupted run's losses and grad norms bit for bit (BF16 and NVFP4 recipes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "core/checksum.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "model/precision_plan.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/mock_runs.h"
#include "observe/checkpointer.h"
#include "observe/stop_conditions.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

TEST(CheckpointChecksum, IndependentOfHowTheBytesAreFed) {
  const size_t chunk = Checksum64::kChunkBytes;
  const auto bytes = random_bytes(5 * chunk + 12345, 7);
  const uint64_t whole = checksum64(bytes.data(), bytes.size());
  Checksum64 pieces;
  pieces.update(bytes.data(), 2 * chunk);
  pieces.update(bytes.data() + 2 * chunk, chunk);
  pieces.update(bytes.data() + 3 * chunk, bytes.size() - 3 * chunk);
  EXPECT_EQ(pieces.digest(), whole);
}

TEST(CheckpointChecksum, EveryByteAndTheLengthMatter) {
  auto bytes = random_bytes(3 * Checksum64::kChunkBytes + 5, 11);
  const uint64_t ref = checksum64(bytes.data(), bytes.size());
  for (size_t pos : {size_t{0}, size_t{7}, Checksum64::kChunkBytes + 3, bytes.size() - 1}) {
    bytes[pos] ^= 0x01;
    EXPECT_NE(checksum64(bytes.data(), bytes.size()), ref) << "flip at " << pos;
    bytes[pos] ^= 0x01;
  }
  EXPECT_NE(checksum64(bytes.data(), bytes.size() - 1), ref);
  // Zero bytes appended to a tail are not invisible (the length is folded in).
  std::vector<unsigned char> a(9, 0), b(10, 0);
  EXPECT_NE(checksum64(a.data(), a.size()), checksum64(b.data(), b.size()));
}

TEST(CheckpointChecksum, UpdatesAfterAShortPieceAreRefused) {
  const auto bytes = random_bytes(100, 3);
  Checksum64 c;
  c.update(bytes.data(), 50);
  EXPECT_THROW(c.update(bytes.data() + 50, 50), Error);
}

// A tiny run with its own model and data; `exit_at` > 0 stops there and saves into `save_dir`.
struct TinyCkptRun {
  TrainConfig t;
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  PrecisionPlan plan;
  std::string recipe;
  std::unique_ptr<data::MockGPTDataset> data;
  std::unique_ptr<LlamaModel> model;

  TinyCkptRun(const std::string& recipe_name, uint64_t init_seed) : recipe(recipe_name) {
    t.train_iters = 8;
    t.warmup_iters = 2;
    t.global_batch_size = 4;
    t.micro_batch_size = 2;
    t.seq_length = 32;
    plan = make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
    data = std::make_unique<data::MockGPTDataset>(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, t.seq_length,
                                                                       t.train_iters * t.global_batch_size, 1234});
    model = std::make_unique<LlamaModel>(m, t.micro_batch_size, t.seq_length, OpContext{}, plan);
    model->init_parameters(init_seed);
  }
  RunDescription describe() const { return test::mock_run_description(m, recipe, t); }
  Trainer trainer(std::vector<TrainObserver*> observers = {}) {
    return Trainer(*model, t, Batches{test::mock_batches(*data, t)}, std::move(observers));
  }
};

void expect_resume_is_bit_identical(const std::string& recipe) {
  SCOPED_TRACE(recipe);
  test::TempDir dir;
  const std::string save = (dir.path() / "ckpt").string();

  TinyCkptRun straight(recipe, 1234);
  test::RunRecorder full;
  straight.trainer({&full}).run();

  // --exit-interval 4 with --save: the stop conditions end the run after iteration 4, the checkpoints' observer
  // saves it.
  TinyCkptRun first(recipe, 1234);
  std::vector<std::string> lines;
  const auto print = [&lines](const std::string& l) { lines.push_back(l); };
  observe::StopConditions stop(observe::StopConfig{.exit_interval = 4}, nullptr, std::chrono::steady_clock::now());
  observe::Checkpointer saver(observe::CheckpointConfig{.save = save}, first.describe(), std::nullopt, nullptr, "",
                              print);
  test::RunRecorder part1;
  const log::RunEnd end1 = first.trainer({&stop, &saver, &part1}).run();
  EXPECT_EQ(end1.last_iteration, 4);
  EXPECT_EQ(end1.stop.cause, log::StopCause::ExitInterval);
  EXPECT_EQ(end1.allocations_in_loop, 0u) << "saving allocated a Buffer inside the loop";
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("saving checkpoint at iteration       4 to " + save), std::string::npos) << lines[0];

  // The resume: the checkpoints' observer restores --load's checkpoint before the first iteration, and says
  // where the run continues.
  TinyCkptRun second(recipe, 999);  // other initial weights: everything must come from the checkpoint
  VerifiedCheckpoint c = verify_checkpoint(save);
  EXPECT_EQ(c.iteration, 4);
  EXPECT_TRUE(compare_checkpoint_with_run(c, second.m, recipe, second.t).empty());
  observe::Checkpointer loader(observe::CheckpointConfig{}, second.describe(), std::move(c), nullptr, save, print);
  const TrainState st = loader.start_state();
  EXPECT_EQ(st.consumed_samples, 4 * second.t.global_batch_size);
  test::RunRecorder part2;
  const log::RunEnd end2 = second.trainer({&loader, &part2}).run(st);
  EXPECT_NE(lines.back().find("successfully loaded checkpoint from " + save), std::string::npos) << lines.back();
  ASSERT_EQ(part2.loss().size(), 4u);
  EXPECT_EQ(end2.first_iteration, 5);
  EXPECT_EQ(end2.allocations_in_loop, 0u);
  for (size_t i = 0; i < 4; ++i) {
    // Exact equality: same bits, not merely close.
    const double a = part2.loss()[i], b = full.loss()[i + 4], an = part2.grad_norm()[i], bn = full.grad_norm()[i + 4];
    EXPECT_EQ(std::memcmp(&a, &b, sizeof(double)), 0) << "iteration " << i + 5 << ": " << a << " vs " << b;
    EXPECT_EQ(std::memcmp(&an, &bn, sizeof(double)), 0) << "iteration " << i + 5 << ": " << an << " vs " << bn;
    EXPECT_EQ(part2.lr_used()[i], full.lr_used()[i + 4]);
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(part1.loss()[i], full.loss()[i]);
  // And the final master weights are the same bits.
  const int64_t n = straight.model->num_params();
  EXPECT_EQ(std::memcmp(straight.model->master().flat.data, second.model->master().flat.data,
                        static_cast<size_t>(n) * 4),
            0);
}

TEST(CheckpointResume, Bf16IsBitIdentical) { expect_resume_is_bit_identical("bf16_mixed"); }
TEST(CheckpointResume, Nvfp4IsBitIdentical) { expect_resume_is_bit_identical("bf16_with_nvfp4_mixed"); }

TEST(CheckpointResume, AnotherModelShapeIsRefusedNamingTheField) {
  test::TempDir dir;
  TinyCkptRun run("bf16_mixed", 1);
  Trainer tr = run.trainer();
  TrainState st;
  save_checkpoint(dir.path().string(), 0, *run.model, tr.optimizer(), st, run.describe());
  const VerifiedCheckpoint c = verify_checkpoint(dir.path().string());
  ModelConfig other = run.m;
  other.ffn_hidden_size *= 2;
  test::expect_one_line_error([&] { compare_checkpoint_with_run(c, other, "bf16_mixed", run.t); },
                              {"ffn_hidden_size", "256", "512"});
  TrainConfig t2 = run.t;
  t2.global_batch_size = 8;
  const auto notes = compare_checkpoint_with_run(c, run.m, "bf16_with_nvfp4_mixed", t2);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("recipe bf16_mixed, resuming with recipe bf16_with_nvfp4_mixed"), std::string::npos);
  EXPECT_NE(notes[1].find("--global-batch-size 4, resuming with 8"), std::string::npos);
}

TEST(CheckpointSave, KeepLastPrunesOnlyAfterTheNewOneIsComplete) {
  test::TempDir dir;
  TinyCkptRun run("bf16_mixed", 1);
  Trainer tr = run.trainer();
  TrainState st;
  for (int64_t it : {10, 20, 30, 40}) {
    st.iteration = it;
    save_checkpoint(dir.path().string(), 2, *run.model, tr.optimizer(), st, run.describe());
  }
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000030", "iter_0000040", "latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(test::read_text_file((dir.path() / "latest_checkpointed_iteration.txt").string()), "40\n");
  // A re-save of the newest iteration swaps it atomically and stays loadable.
  save_checkpoint(dir.path().string(), 2, *run.model, tr.optimizer(), st, run.describe());
  EXPECT_EQ(verify_checkpoint(dir.path().string()).iteration, 40);
}

// The write hook (the seam tests/tools/checkpoint_stall uses to kill a save) throwing part way
// through any file: the save fails, the previous checkpoint and the tracker are untouched and no
// temporary is left.
TEST(CheckpointSave, AnInterruptedSaveLeavesThePreviousCheckpoint) {
  test::TempDir dir;
  const std::string d = dir.path().string();
  TinyCkptRun run("bf16_mixed", 1);
  Trainer tr = run.trainer();
  TrainState st;
  st.iteration = 10;
  std::vector<std::string> seen;
  save_checkpoint(d, 0, *run.model, tr.optimizer(), st, run.describe(), [&](const std::string& f) { seen.push_back(f); });
  EXPECT_EQ(seen, (std::vector<std::string>{"master_fp32.bin", "weights_bf16.bin", "adam_m_fp32.bin", "adam_v_fp32.bin",
                                            "metadata.json", "manifest.json", "latest_checkpointed_iteration.txt"}));
  const std::string manifest = test::read_text_file(d + "/iter_0000010/manifest.json");
  const uint64_t manifest_sum = checksum64(manifest.data(), manifest.size());
  for (const std::string& stop : seen) {
    SCOPED_TRACE(stop);
    for (int64_t it : {10, 20}) {  // a re-save of the same iteration and a new one
      st.iteration = it;
      EXPECT_THROW(save_checkpoint(d, 0, *run.model, tr.optimizer(), st, run.describe(),
                                   [&](const std::string& f) {
                                     if (f == stop) throw Error("interrupted in " + f);
                                   }),
                   Error);
      std::vector<std::string> names;
      for (const auto& e : std::filesystem::directory_iterator(d)) names.push_back(e.path().filename().string());
      std::sort(names.begin(), names.end());
      // Only the tracker's own write comes after the iter_ directory is complete and in place.
      const bool published = stop == "latest_checkpointed_iteration.txt";
      std::vector<std::string> expected = {"iter_0000010", "latest_checkpointed_iteration.txt"};
      if (published && it == 20) expected.insert(expected.begin() + 1, "iter_0000020");
      EXPECT_EQ(names, expected);
      std::filesystem::remove_all(dir.path() / "iter_0000020");
      EXPECT_EQ(test::read_text_file(d + "/latest_checkpointed_iteration.txt"), "10\n");
      const std::string m = test::read_text_file(d + "/iter_0000010/manifest.json");
      if (!published) {
        EXPECT_EQ(checksum64(m.data(), m.size()), manifest_sum);
      }
      EXPECT_EQ(verify_checkpoint(d).iteration, 10);
    }
  }
}

}  // namespace
}  // namespace pl

// Issue 14, class 10: the free-space check compares one checkpoint with the file system's free bytes.
TEST(SaveDirectoryLock, FreeSpaceCheckRefusesACheckpointLargerThanTheDisk) {
  pl::test::TempDir dir;
  const pl::SaveDirectoryLock lock((dir.path() / "ckpt").string());
  EXPECT_NO_THROW(lock.check_free_space(1000));
  pl::test::expect_one_line_error([&] { lock.check_free_space(uint64_t{1} << 62); }, {"--save", "GB free", "needs"});
  // The same process cannot take the lock twice through a second open file description.
  pl::test::expect_one_line_error([&] { pl::SaveDirectoryLock again((dir.path() / "ckpt").string()); },
                                  {"another run", "pid"});
}
