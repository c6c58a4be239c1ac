// Command line and PET_* environment parsing of ddprun.
#include "launcher_options.h"

#include <gtest/gtest.h>

#include <map>

namespace ddprun {
namespace {

constexpr int kCores = 8;

using Env = std::map<std::string, std::string>;

// A host with `cores` cores whose GPU counter reports `gpus` (why none: libcuda missing), and
// counts its calls in `*count_calls` when given.
HostResources Host(int cores, int gpus, int* count_calls = nullptr) {
  HostResources host;
  host.online_cores = cores;
  host.count_gpus = [gpus, count_calls] {
    if (count_calls != nullptr) ++*count_calls;
    GpuCount count;
    count.count = gpus;
    if (gpus == 0)
      count.why_none = "the CUDA driver library could not be loaded (libcuda.so.1: not found)";
    return count;
  };
  return host;
}

ParseResult Parse(const std::vector<std::string>& args, const Env& env = {},
                  const HostResources& host = Host(kCores, 0)) {
  return ParseLauncherOptions(
      args,
      [&env](const std::string& name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      host);
}

LauncherOptions ParseOk(const std::vector<std::string>& args, const Env& env = {}) {
  ParseResult result = Parse(args, env);
  EXPECT_EQ(result.action, ParseResult::Action::kRun) << result.error;
  return result.options;
}

// The error message, asserting that parsing failed.
std::string ParseError(const std::vector<std::string>& args, const Env& env = {}) {
  ParseResult result = Parse(args, env);
  EXPECT_EQ(result.action, ParseResult::Action::kError);
  return result.error;
}

TEST(LauncherOptions, DefaultsMatchTorchrun) {
  LauncherOptions o = ParseOk({"prog"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_FALSE(o.standalone);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_DOUBLE_EQ(o.monitor_interval_s, 0.1);
  EXPECT_EQ(o.run_id, "none");
  EXPECT_EQ(o.role, "default");
  EXPECT_DOUBLE_EQ(o.stop_grace_s, 5.0);
  EXPECT_EQ(o.command, std::vector<std::string>{"prog"});
}

TEST(LauncherOptions, AcceptsDashUnderscoreEqualsAndSpaceForms) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--nproc-per-node", "4", "p"},
           {"--nproc_per_node", "4", "p"},
           {"--nproc-per-node=4", "p"},
           {"--nproc_per_node=4", "p"},
       }) {
    EXPECT_EQ(ParseOk(args).nproc_per_node, 4) << args[0];
  }
}

TEST(LauncherOptions, ParsesEveryOption) {
  LauncherOptions o =
      ParseOk({"--nnodes=3", "--node_rank", "2", "--master_addr", "10.0.0.1", "--master-port=1234",
               "--max_restarts", "5", "--monitor-interval", "0.25", "--run_id=job7", "--role",
               "trainer", "--stop-grace", "0", "--no_python", "--nproc-per-node", "2", "prog"});
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.max_restarts, 5);
  EXPECT_DOUBLE_EQ(o.monitor_interval_s, 0.25);
  EXPECT_EQ(o.run_id, "job7");
  EXPECT_EQ(o.role, "trainer");
  EXPECT_DOUBLE_EQ(o.stop_grace_s, 0.0);
  EXPECT_EQ(o.nproc_per_node, 2);
}

TEST(LauncherOptions, AutoAndCpuMeanOnlineCoresWithoutGpus) {
  EXPECT_EQ(ParseOk({"--nproc-per-node", "auto", "p"}).nproc_per_node, kCores);
  EXPECT_EQ(ParseOk({"--nproc_per_node=cpu", "p"}).nproc_per_node, kCores);
}

TEST(LauncherOptions, GpuMeansOneWorkerPerGpu) {
  ParseResult result = Parse({"--nproc-per-node", "gpu", "p"}, {}, Host(16, 4));
  ASSERT_EQ(result.action, ParseResult::Action::kRun) << result.error;
  EXPECT_EQ(result.options.nproc_per_node, 4);
  result = Parse({"p"}, {{"PET_NPROC_PER_NODE", "gpu"}}, Host(16, 1));
  ASSERT_EQ(result.action, ParseResult::Action::kRun) << result.error;
  EXPECT_EQ(result.options.nproc_per_node, 1);
}

TEST(LauncherOptions, GpuWithoutGpusIsAnErrorSayingWhyAndWhatToUseInstead) {
  ParseResult result = Parse({"--nproc-per-node=gpu", "p"}, {}, Host(16, 0));
  ASSERT_EQ(result.action, ParseResult::Action::kError);
  for (const char* part : {"--nproc-per-node", "'gpu'", "no GPU visible",
                           "the CUDA driver library could not be loaded (libcuda.so.1: not found)",
                           "'cpu'", "number"}) {
    EXPECT_NE(result.error.find(part), std::string::npos) << part << " in: " << result.error;
  }
  EXPECT_EQ(result.error.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << result.error;

  // A device list that hides every GPU is named, as is the variable the value came from.
  result = Parse({"p"}, {{"PET_NPROC_PER_NODE", "gpu"}, {"CUDA_VISIBLE_DEVICES", ""}}, Host(16, 0));
  ASSERT_EQ(result.action, ParseResult::Action::kError);
  EXPECT_NE(result.error.find("PET_NPROC_PER_NODE"), std::string::npos) << result.error;
  EXPECT_NE(result.error.find("CUDA_VISIBLE_DEVICES is ''"), std::string::npos) << result.error;
}

TEST(LauncherOptions, AutoMeansGpusWhenThereAreSomeElseCores) {
  EXPECT_EQ(Parse({"--nproc-per-node", "auto", "p"}, {}, Host(16, 2)).options.nproc_per_node, 2);
  ParseResult result = Parse({"--nproc-per-node", "auto", "p"}, {}, Host(16, 0));
  ASSERT_EQ(result.action, ParseResult::Action::kRun) << result.error;
  EXPECT_EQ(result.options.nproc_per_node, 16);
}

TEST(LauncherOptions, CpuMeansCoresEvenWithGpus) {
  int count_calls = 0;
  ParseResult result = Parse({"--nproc-per-node", "cpu", "p"}, {}, Host(16, 4, &count_calls));
  ASSERT_EQ(result.action, ParseResult::Action::kRun) << result.error;
  EXPECT_EQ(result.options.nproc_per_node, 16);
  EXPECT_EQ(count_calls, 0);
}

TEST(LauncherOptions, GpusAreCountedOnlyForGpuOrAutoAndAtMostOnce) {
  int count_calls = 0;
  HostResources host = Host(16, 4, &count_calls);
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"p"}, {"--nproc-per-node", "3", "p"}, {"--nproc-per-node=cpu", "p"}}) {
    EXPECT_EQ(Parse(args, {}, host).action, ParseResult::Action::kRun) << args[0];
  }
  // The command line overrides the fallback, which is then never looked at.
  Parse({"--nproc-per-node", "2", "p"}, {{"PET_NPROC_PER_NODE", "gpu"}}, host);
  EXPECT_EQ(count_calls, 0);
  Parse({"--nproc-per-node=gpu", "--nproc-per-node", "auto", "p"}, {}, host);
  EXPECT_EQ(count_calls, 1);
}

TEST(LauncherOptions, CoresAreAtLeastOne) {
  EXPECT_EQ(Parse({"--nproc-per-node", "cpu", "p"}, {}, Host(0, 0)).options.nproc_per_node, 1);
  EXPECT_EQ(Parse({"--nproc-per-node", "auto", "p"}, {}, Host(-1, 0)).options.nproc_per_node, 1);
}

TEST(LauncherOptions, NnodesAcceptsEqualMinMaxOnly) {
  EXPECT_EQ(ParseOk({"--nnodes", "2:2", "p"}).nnodes, 2);
  std::string error = ParseError({"--nnodes", "1:4", "p"});
  EXPECT_NE(error.find("--nnodes"), std::string::npos) << error;
  EXPECT_NE(error.find("1:4"), std::string::npos) << error;
  EXPECT_NE(error.find("elastic"), std::string::npos) << error;
}

TEST(LauncherOptions, LaterOccurrenceWins) {
  EXPECT_EQ(ParseOk({"--nproc-per-node=2", "--nproc_per_node", "3", "p"}).nproc_per_node, 3);
}

TEST(LauncherOptions, BadValuesNameTheFlagTheValueAndWhatIsAccepted) {
  struct Case {
    std::vector<std::string> args;
    std::string flag;
    std::string value;
  };
  for (const Case& c : std::vector<Case>{
           {{"--nproc-per-node", "zero", "p"}, "--nproc-per-node", "'zero'"},
           {{"--nproc_per_node=0", "p"}, "--nproc_per_node", "'0'"},
           {{"--nproc-per-node=-1", "p"}, "--nproc-per-node", "'-1'"},
           {{"--nnodes", "0", "p"}, "--nnodes", "'0'"},
           {{"--nnodes", "2x", "p"}, "--nnodes", "'2x'"},
           {{"--node-rank", "-1", "p"}, "--node-rank", "'-1'"},
           {{"--master-port", "0", "p"}, "--master-port", "'0'"},
           {{"--master_port=65536", "p"}, "--master_port", "'65536'"},
           {{"--master-port", "80a", "p"}, "--master-port", "'80a'"},
           {{"--max-restarts", "-2", "p"}, "--max-restarts", "'-2'"},
           {{"--monitor-interval", "0", "p"}, "--monitor-interval", "'0'"},
           {{"--monitor-interval", "fast", "p"}, "--monitor-interval", "'fast'"},
           {{"--stop-grace", "-1", "p"}, "--stop-grace", "'-1'"},
           {{"--master-addr=", "p"}, "--master-addr", "''"},
       }) {
    std::string error = ParseError(c.args);
    EXPECT_NE(error.find(c.flag), std::string::npos) << error;
    EXPECT_NE(error.find(c.value), std::string::npos) << error;
    EXPECT_NE(error.find("expected"), std::string::npos) << error;
  }
}

TEST(LauncherOptions, BadNprocPerNodeListsEveryAcceptedWord) {
  std::string error = ParseError({"--nproc-per-node", "gpus", "p"});
  for (const char* word : {"integer", "'gpu'", "'cpu'", "'auto'"}) {
    EXPECT_NE(error.find(word), std::string::npos) << word << " in: " << error;
  }
}

TEST(LauncherOptions, NodeRankMustBeBelowNnodes) {
  EXPECT_EQ(ParseOk({"--nnodes", "2", "--node-rank", "1", "p"}).node_rank, 1);
  std::string error = ParseError({"--nnodes", "2", "--node-rank", "2", "p"});
  EXPECT_NE(error.find("--node-rank"), std::string::npos) << error;
  EXPECT_NE(error.find("'2'"), std::string::npos) << error;
}

TEST(LauncherOptions, UnknownOptionIsAnError) {
  EXPECT_NE(ParseError({"--bogus", "p"}).find("'--bogus'"), std::string::npos);
  EXPECT_NE(ParseError({"--bogus=3", "p"}).find("'--bogus'"), std::string::npos);
  EXPECT_NE(ParseError({"-x", "p"}).find("'-x'"), std::string::npos);
}

TEST(LauncherOptions, MissingValueIsAnError) {
  std::string error = ParseError({"--nproc-per-node"});
  EXPECT_NE(error.find("--nproc-per-node"), std::string::npos) << error;
  EXPECT_NE(error.find("expected a value"), std::string::npos) << error;
}

TEST(LauncherOptions, FlagWithValueIsAnError) {
  EXPECT_NE(ParseError({"--standalone=yes", "p"}).find("--standalone"), std::string::npos);
}

TEST(LauncherOptions, MissingProgramIsAnError) {
  EXPECT_NE(ParseError({}).find("missing PROGRAM"), std::string::npos);
  EXPECT_NE(ParseError({"--nproc-per-node", "2"}).find("missing PROGRAM"), std::string::npos);
  EXPECT_NE(ParseError({"--"}).find("missing PROGRAM"), std::string::npos);
}

TEST(LauncherOptions, ProgramArgumentsPassThroughEvenWhenTheyLookLikeFlags) {
  LauncherOptions o = ParseOk(
      {"--nproc-per-node", "2", "train", "--nproc-per-node", "7", "--lr=3", "-h", "--", "x"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.command, (std::vector<std::string>{"train", "--nproc-per-node", "7", "--lr=3", "-h",
                                                 "--", "x"}));
}

TEST(LauncherOptions, DoubleDashEndsOptions) {
  LauncherOptions o = ParseOk({"--nnodes=1", "--", "--weird-program", "--help"});
  EXPECT_EQ(o.command, (std::vector<std::string>{"--weird-program", "--help"}));
}

TEST(LauncherOptions, HelpBeforeProgramAsksForHelp) {
  EXPECT_EQ(Parse({"--help"}).action, ParseResult::Action::kHelp);
  EXPECT_EQ(Parse({"--nproc-per-node", "2", "-h", "prog"}).action, ParseResult::Action::kHelp);
}

TEST(LauncherOptions, StandaloneRequiresOneNodeAndUsesLoopback) {
  LauncherOptions o = ParseOk({"--standalone", "--master-addr", "10.1.1.1", "p"});
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  std::string error = ParseError({"--standalone", "--nnodes", "2", "p"});
  EXPECT_NE(error.find("--standalone"), std::string::npos) << error;
  EXPECT_NE(error.find("--nnodes"), std::string::npos) << error;
}

TEST(LauncherOptions, PetEnvironmentVariablesAreFallbacks) {
  LauncherOptions o = ParseOk({"p"}, {{"PET_NPROC_PER_NODE", "3"},
                                      {"PET_MASTER_PORT", "4000"},
                                      {"PET_NNODES", "2"},
                                      {"PET_NODE_RANK", "1"},
                                      {"PET_MASTER_ADDR", "h"},
                                      {"PET_MAX_RESTARTS", "4"},
                                      {"PET_RUN_ID", "r"},
                                      {"PET_ROLE", "w"},
                                      {"PET_MONITOR_INTERVAL", "2"},
                                      {"PET_STOP_GRACE", "1.5"}});
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(o.master_port, 4000);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "h");
  EXPECT_EQ(o.max_restarts, 4);
  EXPECT_EQ(o.run_id, "r");
  EXPECT_EQ(o.role, "w");
  EXPECT_DOUBLE_EQ(o.monitor_interval_s, 2.0);
  EXPECT_DOUBLE_EQ(o.stop_grace_s, 1.5);
  EXPECT_TRUE(ParseOk({"p"}, {{"PET_STANDALONE", "1"}}).standalone);
  EXPECT_FALSE(ParseOk({"p"}, {{"PET_STANDALONE", "0"}}).standalone);
}

TEST(LauncherOptions, CommandLineWinsOverPetEnvironment) {
  Env env = {{"PET_NPROC_PER_NODE", "3"}, {"PET_MASTER_PORT", "4000"}};
  LauncherOptions o = ParseOk({"--nproc_per_node=5", "p"}, env);
  EXPECT_EQ(o.nproc_per_node, 5);
  EXPECT_EQ(o.master_port, 4000);
  // An invalid fallback that the command line overrides is never looked at.
  EXPECT_EQ(ParseOk({"--master-port", "5", "p"}, {{"PET_MASTER_PORT", "bad"}}).master_port, 5);
}

TEST(LauncherOptions, BadPetValueNamesTheVariable) {
  std::string error = ParseError({"p"}, {{"PET_MASTER_PORT", "99999"}});
  EXPECT_NE(error.find("PET_MASTER_PORT"), std::string::npos) << error;
  EXPECT_NE(error.find("'99999'"), std::string::npos) << error;
}

TEST(LauncherOptions, UsageDocumentsEveryFlagEnvironmentAndExitCodes) {
  std::string usage = UsageText();
  for (const char* word : {"--help",
                           "--nproc-per-node",
                           "--nnodes",
                           "--node-rank",
                           "--master-addr",
                           "--master-port",
                           "--standalone",
                           "--max-restarts",
                           "--monitor-interval",
                           "--run-id",
                           "--role",
                           "--stop-grace",
                           "N|gpu|cpu|auto",
                           "libcuda.so.1",
                           "CUDA_VISIBLE_DEVICES",
                           "PET_NPROC_PER_NODE",
                           "RANK",
                           "LOCAL_RANK",
                           "WORLD_SIZE",
                           "LOCAL_WORLD_SIZE",
                           "GROUP_RANK",
                           "GROUP_WORLD_SIZE",
                           "ROLE_RANK",
                           "ROLE_WORLD_SIZE",
                           "ROLE_NAME",
                           "MASTER_ADDR",
                           "MASTER_PORT",
                           "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_MAX_RESTARTS",
                           "TORCHELASTIC_RUN_ID",
                           "OMP_NUM_THREADS",
                           "exit",
                           "128+"}) {
    EXPECT_NE(usage.find(word), std::string::npos) << word;
  }
}

}  // namespace
}  // namespace ddprun
