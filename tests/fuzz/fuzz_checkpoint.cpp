// tests/fuzz/fuzz_checkpoint.cpp: the checkpoint readers (pipeline/checkpoint.hpp, in_flight.cpp):
// the `latest` pointer, the MANIFEST, trainer.txt and its counters, the model's and the optimizers'
// state, the accumulated gradients and a pipeline's mini-batches in flight.
//
// Input: sections (tests/fuzz/fuzz_files.hpp) laid out as a --checkpoint-dir: "latest",
// "epoch-000001/MANIFEST", "epoch-000001/model/...". The directory is verified as --resume does
// (latest_checkpoint), then every checkpoint directory in it is resumed into one run built once:
// PETRA on a RevNet18 of width 1, synthetic data (2 images, mini-batches of 1, 2 epochs), the run
// of the seeds in corpus/checkpoint/ (tests/fuzz/make_corpus.py writes them with petra-train).
// Resuming skips the MANIFEST's checksums, so the readers behind them are reached by mutated files.
#include <cstddef>
#include <cstdint>

#include "petra/pipeline/checkpoint.hpp"
#include "petra/pipeline/trainer.hpp"
#include "tests/fuzz/fuzz_files.hpp"

namespace {

petra::pipeline::Trainer& run(const std::filesystem::path& checkpoint_dir) {
  static petra::pipeline::Trainer trainer = [&] {
    petra::pipeline::TrainConfig c;
    c.dataset = "synthetic";
    c.synthetic_train_size = 2;
    c.batch_size = 1;
    c.width = 1;
    c.epochs = 2;
    c.method = petra::pipeline::PipelineMethod::petra;
    c.threads = 1;
    c.checkpoint_dir = checkpoint_dir;
    return petra::pipeline::Trainer(c);
  }();
  return trainer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace petra;
  static fuzz::Scratch scratch("checkpoint");
  pipeline::Trainer& trainer = run(scratch.path());
  const auto& root = scratch.fresh();
  fuzz::write_sections(root, {data, size}, "latest");
  fuzz::only_petra_errors([&] { pipeline::latest_checkpoint(root); });
  int resumed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root))
    if (entry.is_directory() && ++resumed <= 2) fuzz::only_petra_errors([&] { trainer.resume_from(entry.path()); });
  return 0;
}
