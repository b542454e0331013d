// tests/cpu/test_trainer.cpp: the training loop: resuming from a checkpoint is bit-identical to
// not stopping; damaged or mismatched checkpoints are refused; divergence stops training; the
// pipelined options (--flush-each-epoch, --track-gradient-quality) do what they say.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "petra/pipeline/checkpoint.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/pipeline/trainer.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/resume.hpp"

using namespace petra;
using namespace petra::pipeline;
namespace fs = std::filesystem;
using petra::testing::TemporaryDirectory;

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

std::vector<std::vector<float>> parameters_of(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const auto& p : t.model().parameters()) out.push_back(p.data().to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("a resumed run reaches bit-identical parameters") {
  const TemporaryDirectory straight_dir("trainer-straight"), resumed_dir("trainer-resumed");
  Trainer straight(tiny(straight_dir.path()));
  straight.run({}, {});
  CHECK(straight.epoch() == 3);

  {
    TrainConfig first = tiny(resumed_dir.path());
    first.max_steps = 5;  // stops during epoch 2 of 3 (4 steps per epoch): only epoch 1 is checkpointed
    Trainer interrupted(first);
    interrupted.run({}, {});
  }
  TrainConfig again = tiny(resumed_dir.path());
  again.resume = true;
  Trainer resumed(again);
  CHECK(resumed.epoch() == 1);
  CHECK(resumed.global_step() == 4);
  resumed.run({}, {});
  CHECK(parameters_of(resumed) == parameters_of(straight));
}

TEST_CASE("damaged or mismatched checkpoints are refused with a clear message") {
  const TemporaryDirectory temporary("trainer-damaged");
  const fs::path& dir = temporary.path();
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
    REQUIRE(fs::remove(checkpoint / "optimizer" / "stage-01" / "optimizer_state.txt"));  // one per stage
    CHECK_THROWS_AS(Trainer{c}, CheckpointError);
  }
  SUBCASE("an unfinished checkpoint (no manifest)") {
    fs::remove(checkpoint / "MANIFEST");
    CHECK_THROWS_AS(Trainer{c}, CheckpointError);
  }
}

TEST_CASE("after the final drain, batch norm's running statistics are recomputed over the last mini-batches") {
  TrainConfig c = tiny({});
  c.method = PipelineMethod::petra;
  c.accumulation = 1;
  c.epochs = 2;  // 4 mini-batches per epoch: the last epoch's are 4..7
  c.bn_refresh_batches = 3;
  Trainer refreshed(c);
  refreshed.run({}, {});
  c.bn_refresh_batches = 0;
  Trainer as_moved(c);
  as_moved.run({}, {});
  CHECK(parameters_of(refreshed) == parameters_of(as_moved));  // only the buffers change
  const auto buffers_of = [](Trainer& t) {
    std::vector<std::vector<float>> out;
    for (const auto& [name, b] : t.model().named_buffers()) out.push_back(b.to_vector<float>());
    return out;
  };
  const auto before = buffers_of(as_moved);
  CHECK(buffers_of(refreshed) != before);
  as_moved.recompute_batch_norm_statistics(5, 8);  // what run() did: the epoch's last 3
  CHECK(buffers_of(refreshed) == buffers_of(as_moved));
}

TEST_CASE("options of the pipelined methods are refused, with a reason, for the synchronous ones") {
  TrainConfig c = tiny({});
  c.track_reconstruction = true;
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--track-reconstruction"), ValueError);
  c.track_reconstruction = false;
  c.track_gradient_quality = 2;
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--track-gradient-quality"), ValueError);
}

TEST_CASE("an empty training set or a --classes beyond the limit is refused with what is wrong") {
  TrainConfig c = tiny({});
  c.method = PipelineMethod::backprop;
  c.synthetic_train_size = 0;  // once a run of no steps, or a division by zero under PETRA
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--synthetic-size 0: the training set is empty"), ValueError);
  c.synthetic_train_size = 256;
  c.classes = 100001;
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--classes is 100001, above the limit of 100000"), ValueError);
}

TEST_CASE("resume keys: a mismatch is named; a key added later counts with its old value") {
  TrainConfig c;
  c.method = PipelineMethod::petra;
  CheckpointMeta meta = describe(c);
  CHECK(resume_mismatch(meta, c).empty());
  meta["seed"] = "7";
  CHECK(resume_mismatch(meta, c).find("seed = 7") != std::string::npos);
  meta = describe(c);
  meta.erase("arch");
  CHECK(resume_mismatch(meta, c) == "has no 'arch'");
  // A checkpoint from before --delay-compensation existed: resumable without it, not with it.
  meta = describe(c);
  meta.erase("delay_compensation");
  CHECK(resume_mismatch(meta, c).empty());
  c.delay_compensation = true;
  CHECK(resume_mismatch(meta, c).find("delay_compensation = false") != std::string::npos);
  // Likewise --stages: one block per stage, however spelled, resumes an older checkpoint.
  c.delay_compensation = false;
  meta = describe(c);
  meta.erase("stage_sizes");
  c.stage_sizes = std::vector<std::int64_t>(10, 1);
  CHECK(resume_mismatch(meta, c).empty());
  c.stage_sizes = {5, 5};
  CHECK(resume_mismatch(meta, c).find("this run has stage_sizes = 5,5") != std::string::npos);
}

TEST_CASE("a diverging run stops with DivergedError and the last checkpoint stays valid") {
  const TemporaryDirectory temporary("trainer-diverge");
  const fs::path& dir = temporary.path();
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
}

namespace {
TrainConfig tiny_pipelined() {
  TrainConfig c = tiny({});
  c.method = PipelineMethod::petra;
  c.accumulation = 1;
  c.epochs = 2;
  return c;
}
}  // namespace

TEST_CASE("--flush-each-epoch drains the pipeline at every epoch end") {
  TrainConfig flushed = tiny_pipelined();
  flushed.flush_each_epoch = true;
  Trainer a(flushed);
  const std::int64_t S = a.steps_per_epoch(), J = static_cast<std::int64_t>(a.model().num_stages());
  CHECK(a.schedule().steps == 2 * (S + 2 * (J - 1)));
  CHECK(check_schedule(a.schedule()).empty());
  std::vector<std::int64_t> ends;
  a.run({}, [&](const EpochReport&) { ends.push_back(a.global_step()); });
  CHECK(ends == std::vector<std::int64_t>{S + 2 * (J - 1), 2 * (S + 2 * (J - 1))});

  // One epoch: flushing changes nothing (the run is drained at its end either way), bit for bit.
  TrainConfig one = tiny_pipelined();
  one.epochs = 1;
  TrainConfig one_flushed = one;
  one_flushed.flush_each_epoch = true;
  Trainer b(one), c(one_flushed);
  b.run({}, {});
  c.run({}, {});
  CHECK(parameters_of(b) == parameters_of(c));
  // Two epochs: the flushed pipeline waits for its drain, so the runs differ.
  Trainer d(tiny_pipelined());
  d.run({}, {});
  CHECK(parameters_of(a) != parameters_of(d));
}

TEST_CASE("--track-gradient-quality: exact with lr = 0, and it does not perturb training") {
  TrainConfig frozen = tiny_pipelined();
  frozen.epochs = 1;
  frozen.lr = 0;
  frozen.track_gradient_quality = 3;
  Trainer t(frozen);
  std::vector<GradientQuality> measured;
  t.run({}, [&](const EpochReport& r) { measured = r.gradient_quality; });
  REQUIRE(!measured.empty());
  CHECK(measured.front().step == 0);
  std::size_t stages_seen = 0;
  for (const auto& q : measured) {
    CHECK(q.step % 3 == 0);
    for (const auto& s : q.stages) {
      CAPTURE(s.stage);
      CHECK(s.cosine == doctest::Approx(1.0).epsilon(1e-5));
      CHECK(s.norm_ratio == doctest::Approx(1.0).epsilon(1e-4));
      // Looser than the cosine: conv biases followed by batch norm have an analytically zero
      // gradient, so those entries are pure rounding noise of two different summation orders.
      CHECK(s.relative_error <= 1e-3);
    }
    stages_seen = std::max(stages_seen, q.stages.size());
  }
  // 4 mini-batches in flight at most (one epoch of 4): at best 4 stages run a backward in one step.
  CHECK(stages_seen == static_cast<std::size_t>(std::min<std::int64_t>(t.steps_per_epoch(), 10)));

  // With a learning rate the delayed gradients differ from backprop's, and the run is the same
  // bit for bit as one that does not measure.
  TrainConfig moving = tiny_pipelined();
  moving.track_gradient_quality = 2;
  Trainer tracked(moving);
  double lowest_cosine = 1;
  tracked.run({}, [&](const EpochReport& r) {
    for (const auto& q : r.gradient_quality)
      for (const auto& s : q.stages) lowest_cosine = std::min(lowest_cosine, s.cosine);
  });
  CHECK(lowest_cosine < 0.999);
  Trainer untracked(tiny_pipelined());
  untracked.run({}, {});
  CHECK(parameters_of(tracked) == parameters_of(untracked));
}

TEST_CASE("a pipelined run resumed from a checkpoint, mini-batches in flight, is bit-identical") {
  for (PipelineMethod method : {PipelineMethod::petra, PipelineMethod::pipedream}) {
    CAPTURE(name_of(method));
    TrainConfig c = tiny_pipelined();
    c.method = method;
    c.epochs = 3;
    c.accumulation = 3;  // windows open across epoch ends, per stage
    Trainer straight(c);
    straight.run({}, {});

    // The process dies right after epoch 1's checkpoint: 4 mini-batches are in flight then.
    const TemporaryDirectory checkpoints("trainer-pipelined");
    const auto resumed = petra::testing::resume_after_first_epoch(c, checkpoints.path());
    resumed->run({}, {});
    CHECK(parameters_of(*resumed) == parameters_of(straight));
  }
}

TEST_CASE("training runs on the devices asked for or not at all: no silent fallback to the CPU") {
  for (const PipelineMethod method : {PipelineMethod::backprop, PipelineMethod::petra}) {
    CAPTURE(name_of(method));
    TrainConfig c = tiny({});
    c.method = method;
    c.accumulation = 1;
    // A GPU index no machine here has: refused, naming the device and what the machine has.
    c.devices = {Device::parse("cuda:7")};
    try {
      Trainer t(c);
      FAIL("--devices cuda:7 must be refused");
    } catch (const DeviceError& e) {
      const std::string message = e.what();
      CHECK(message.find("cuda:7") != std::string::npos);
      if (cuda_backend::device_count() <= 7) CHECK(message.find("no such GPU; this machine has") != std::string::npos);
    }
    // cuda:0: refused where there is no GPU, trained there where there is one; never on the CPU.
    c.devices = {Device::parse("cuda:0")};
    if (cuda_backend::device_count() == 0)
      CHECK_THROWS_AS(Trainer{c}, DeviceError);
    else
      CHECK(Trainer(c).device() == Device::cuda(0));
    c.devices = {Device::parse("cpu:0"), Device::parse("cpu:0")};
    CHECK_THROWS_AS(Trainer{c}, ValueError);
  }
}

TEST_CASE("a pipelined run cut by --max-steps checkpoints only complete epochs, and resuming it on two "
          "workers finishes bit-identical to an uninterrupted run") {
  // The old failure: the cut run checkpointed its drained, partial epoch as complete, and resuming
  // it on two workers waited for ever for messages the drain had already consumed.
  TrainConfig c = tiny_pipelined();  // 2 epochs of 4 mini-batches
  c.devices = {Device::parse("cpu:0"), Device::parse("cpu:1")};
  c.placement = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
  c.message_timeout = 60;  // a regression fails in a minute instead of hanging
  Trainer straight(c);
  straight.run({}, {});

  const TemporaryDirectory checkpoints("trainer-max-steps");
  c.checkpoint_dir = checkpoints.path();
  c.max_steps = 6;  // cuts epoch 2 after 2 of its 4 mini-batches
  std::vector<bool> complete;
  {
    Trainer cut(c);
    cut.run({}, [&](const EpochReport& r) { complete.push_back(r.complete); });
    CHECK(cut.epoch() == 1);  // the partial epoch is reported, not counted
  }
  CHECK(complete == std::vector<bool>{true, false});
  CHECK(latest_checkpoint(c.checkpoint_dir).filename() == "epoch-000001");
  c.max_steps = -1;
  c.resume = true;
  Trainer resumed(c);
  CHECK(resumed.epoch() == 1);
  resumed.run({}, {});
  CHECK(parameters_of(resumed) == parameters_of(straight));
}

namespace {
// Rewrites a text file of a checkpoint: its contents become f(contents). (resume_from does not check
// the MANIFEST, so what these cases refuse is the contents.)
template <class F>
void rewrite(const fs::path& file, F f) {
  std::ifstream in(file);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  in.close();
  std::ofstream(file, std::ios::trunc) << f(text);
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

// CheckpointError whose message holds `fragment`, from resuming `dir` into a fresh run of `c`.
void refused(const TrainConfig& c, const fs::path& dir, const std::string& fragment) {
  Trainer t(c);
  CHECK_THROWS_WITH_AS(t.resume_from(dir), doctest::Contains(fragment.c_str()), CheckpointError);
}
}  // namespace

TEST_CASE("a checkpoint's counters, directory name, pipeline in flight and files are checked, never trusted") {
  const TemporaryDirectory temporary("trainer-metadata");
  TrainConfig c = tiny_pipelined();  // 2 epochs of 4 mini-batches, PETRA on the sequential executor
  c.checkpoint_dir = temporary.path();
  { Trainer(c).run({}, {}); }
  const fs::path saved = temporary.path() / "saved";
  fs::copy(temporary.path() / "epoch-000001", saved, fs::copy_options::recursive);
  const fs::path dir = temporary.path() / "epoch-000001";
  const auto reset = [&] {
    fs::remove_all(dir);
    fs::copy(saved, dir, fs::copy_options::recursive);
  };
  const auto meta = [&](const std::string& from, const std::string& to) {
    reset();
    rewrite(dir / "trainer.txt", [&](const std::string& t) { return replaced(t, from, to); });
  };
  {
    Trainer good(c);
    good.resume_from(dir);  // as written: resumes
    CHECK(good.epoch() == 1);
    CHECK(good.global_step() == 4);
  }
  meta("next_epoch = 1\n", "");
  refused(c, dir, "trainer.txt: no 'next_epoch'");
  meta("next_epoch = 1", "next_epoch = one");
  refused(c, dir, "'next_epoch = one' is not an integer");
  meta("global_step = 4", "global_step = 99999999999999999999");
  refused(c, dir, "'global_step = 99999999999999999999' is not an integer");
  meta("next_epoch = 1", "next_epoch = 0");
  refused(c, dir, "'next_epoch = 0' is outside [1, ");
  meta("global_step = 4", "global_step = 22");  // a drained pipeline's step
  refused(c, dir, "global_step = 22 in its trainer.txt, but epoch 1 of this run starts at step 4");
  meta("next_epoch = 1", "next_epoch = 2");  // another epoch than the directory's name
  refused(c, dir, "holds the state after epoch 2 (next_epoch = 2 in its trainer.txt) but its directory is named");

  // The pipeline in flight must be the one the grid leaves at that step.
  reset();
  rewrite(dir / "pipeline" / "channels.txt", [](const std::string& t) { return replaced(t, "forward 0 3\n", ""); });
  refused(c, dir, "the channel from stage 0 up holds mini-batches [] but step 4 of the schedule has [3]");
  reset();
  rewrite(dir / "pipeline" / "stage-00" / "state.txt", [](const std::string& t) { return replaced(t, "received 0", "received 5"); });
  refused(c, dir, "stage 0 has 5 gradients since its last update but step 4 of the schedule says 0");
  reset();
  rewrite(dir / "pipeline" / "stage-00" / "state.txt", [](const std::string& t) { return replaced(t, "kept 0 1", "kept 0 0"); });
  refused(c, dir, "does not fit stage 0 (it keeps its input");

  // Errors of the readers below (an optimizer's manifest, an .npy file) are the checkpoint's.
  reset();
  rewrite(dir / "optimizer" / "stage-02" / "optimizer_state.txt",
          [](const std::string& t) { return replaced(t, "step_count", "step_kount"); });
  refused(c, dir, "unknown entry 'step_kount'");
  reset();
  std::ofstream(dir / "model" / "stages.1.f.conv1.weight.npy", std::ios::trunc) << "not an npy file";
  refused(c, dir, "stages.1.f.conv1.weight.npy");
}

TEST_CASE("the data set's identity is a resume key: other data is refused, a checkpoint without it resumes") {
  const TemporaryDirectory temporary("trainer-identity");
  TrainConfig c = tiny(temporary.path());
  c.epochs = 1;
  { Trainer(c).run({}, {}); }
  const fs::path dir = latest_checkpoint(temporary.path());
  c.epochs = 2;
  c.resume = true;
  {
    Trainer same(c);
    CHECK(same.epoch() == 1);
    CHECK(!same.resumed_data_unchecked());
    CHECK(dataset_identity(same.data()).at("data_train_images").find("[256, 3, 32, 32] uint8 crc32 0x") == 0);
  }
  TrainConfig other = c;
  other.synthetic_train_size = 320;  // other images, the same everything else
  CHECK_THROWS_WITH_AS(Trainer{other}, doctest::Contains("was written on other data: data_test_images = [51, 3, 32, 32]"),
                       CheckpointError);
  // Written before the keys existed: resumed as before, flagged as not compared.
  rewrite(dir / "trainer.txt", [](const std::string& t) {
    std::string kept;
    std::istringstream lines(t);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("data_", 0) != 0) kept += line + "\n";
    return kept;
  });
  TrainConfig fresh = c;
  fresh.resume = false;
  Trainer old(fresh);
  old.resume_from(dir);
  CHECK(old.epoch() == 1);
  CHECK(old.resumed_data_unchecked());
}

TEST_CASE("an epoch that --max-steps ends at its last mini-batch is not checkpointed: its pipeline was drained") {
  const TemporaryDirectory checkpoints("trainer-cut-at-boundary");
  TrainConfig c = tiny_pipelined();
  c.checkpoint_dir = checkpoints.path();
  c.max_steps = 4;  // exactly epoch 1 of 2
  Trainer cut(c);
  std::vector<bool> complete;
  cut.run({}, [&](const EpochReport& r) { complete.push_back(r.complete); });
  CHECK(complete == std::vector<bool>{true});
  CHECK(cut.epoch() == 1);
  CHECK(!cut.last_checkpoint());
  CHECK(!fs::exists(checkpoints.path() / "epoch-000001"));
}
