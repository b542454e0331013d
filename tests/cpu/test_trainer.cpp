// tests/cpu/test_trainer.cpp: the training loop: resuming from a checkpoint is bit-identical to
// not stopping; damaged or mismatched checkpoints are refused; divergence stops training.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "pipeline/checkpoint.hpp"
#include "pipeline/trainer.hpp"

using namespace petra;
using namespace petra::pipeline;
namespace fs = std::filesystem;

namespace {

TrainConfig tiny(const fs::path& checkpoints) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_train_size = 256;
  c.width = 4;
  c.batch_size = 64;  // 4 steps per epoch
  c.epochs = 3;
  c.accumulation = 3;  // an accumulation window stays open across epoch boundaries
  c.lr = 0.05;
  c.warmup_epochs = 1;
  c.schedule = "cosine";
  c.method = PipelineMethod::revbackprop;
  c.seed = 3;
  c.threads = 1;
  c.checkpoint_dir = checkpoints;
  return c;
}

fs::path fresh(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("petra-test-trainer-" + name);
  fs::remove_all(dir);
  return dir;
}

std::vector<std::vector<float>> parameters_of(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const auto& p : t.model().parameters()) out.push_back(p.data().to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("a resumed run reaches bit-identical parameters") {
  const fs::path straight_dir = fresh("straight"), resumed_dir = fresh("resumed");
  Trainer straight(tiny(straight_dir));
  straight.run({}, {});
  CHECK(straight.epoch() == 3);

  {
    TrainConfig first = tiny(resumed_dir);
    first.max_steps = 5;  // stops during epoch 2 of 3 (4 steps per epoch): only epoch 1 is checkpointed
    Trainer interrupted(first);
    interrupted.run({}, {});
  }
  TrainConfig again = tiny(resumed_dir);
  again.resume = true;
  Trainer resumed(again);
  CHECK(resumed.epoch() == 1);
  CHECK(resumed.global_step() == 4);
  resumed.run({}, {});
  CHECK(parameters_of(resumed) == parameters_of(straight));
  fs::remove_all(straight_dir);
  fs::remove_all(resumed_dir);
}

TEST_CASE("damaged or mismatched checkpoints are refused with a clear message") {
  const fs::path dir = fresh("damaged");
  TrainConfig c = tiny(dir);
  c.epochs = 1;
  { Trainer(c).run({}, {}); }
  const fs::path checkpoint = latest_checkpoint(dir);
  c.resume = true;

  SUBCASE("a different model") {
    c.width = 8;
    CHECK_THROWS_AS(Trainer{c}, CheckpointError);
  }
  SUBCASE("a flipped byte") {
    const fs::path victim = checkpoint / "model" / "stages.1.f.conv1.weight.npy";
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
    f.close();
    try {
      Trainer t(c);
      FAIL("a corrupted checkpoint must be refused");
    } catch (const CheckpointError& e) {
      CHECK(std::string(e.what()).find("stages.1.f.conv1.weight.npy") != std::string::npos);
    }
  }
  SUBCASE("a missing file") {
    fs::remove(checkpoint / "optimizer" / "optimizer_state.txt");
    CHECK_THROWS_AS(Trainer{c}, CheckpointError);
  }
  SUBCASE("an unfinished checkpoint (no manifest)") {
    fs::remove(checkpoint / "MANIFEST");
    CHECK_THROWS_AS(Trainer{c}, CheckpointError);
  }
  fs::remove_all(dir);
}

TEST_CASE("a diverging run stops with DivergedError and the last checkpoint stays valid") {
  const fs::path dir = fresh("diverge");
  TrainConfig c = tiny(dir);
  c.epochs = 1;
  { Trainer(c).run({}, {}); }
  const fs::path good = latest_checkpoint(dir);
  c.epochs = 3;
  c.resume = true;  // the learning rate may change on resume: make it explode
  c.lr = 1e30;
  Trainer t(c);
  CHECK_THROWS_AS(t.run({}, {}), DivergedError);
  CHECK(latest_checkpoint(dir) == good);  // still there, still verified
  fs::remove_all(dir);
}
