// Parsing of init_method strings and of the launchers' environments.
#include "rendezvous/rendezvous_spec.h"

#include <gtest/gtest.h>

#include <map>

#include "ddp/errors.h"

using ddp::rendezvous::first_slurm_host;
using ddp::rendezvous::Method;
using ddp::rendezvous::parse_rendezvous;

namespace {

ddp::rendezvous::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const std::string& method, int rank, int world,
                     std::map<std::string, std::string> vars) {
  try {
    parse_rendezvous(method, rank, world, env_of(std::move(vars)));
  } catch (const ddp::DistributedError& e) {
    return e.what();
  }
  return "";
}

const std::map<std::string, std::string> kTorchrun = {{"MASTER_ADDR", "10.1.2.3"},
                                                      {"MASTER_PORT", "29500"},
                                                      {"RANK", "2"},
                                                      {"WORLD_SIZE", "4"},
                                                      {"LOCAL_RANK", "0"}};

}  // namespace

TEST(RendezvousSpec, EnvMethodReadsTorchrunVariables) {
  auto spec = parse_rendezvous("env://", -1, -1, env_of(kTorchrun));
  EXPECT_EQ(spec.method, Method::kEnv);
  EXPECT_EQ(spec.host, "10.1.2.3");
  EXPECT_EQ(spec.port, 29500);
  EXPECT_EQ(spec.rank, 2);
  EXPECT_EQ(spec.world_size, 4);
  EXPECT_EQ(spec.local_rank, 0);
  EXPECT_FALSE(spec.use_agent_store);
}

TEST(RendezvousSpec, OptionsWinOverTheEnvironment) {
  auto spec = parse_rendezvous("env://", 1, 3, env_of(kTorchrun));
  EXPECT_EQ(spec.rank, 1);
  EXPECT_EQ(spec.world_size, 3);
}

TEST(RendezvousSpec, EmptyInitMethodMeansEnv) {
  EXPECT_EQ(parse_rendezvous("", -1, -1, env_of(kTorchrun)).method, Method::kEnv);
}

TEST(RendezvousSpec, MissingMasterAddrNamesTheVariable) {
  auto vars = kTorchrun;
  vars.erase("MASTER_ADDR");
  EXPECT_NE(error_of("env://", -1, -1, vars).find("environment variable MASTER_ADDR expected"),
            std::string::npos);
  vars = kTorchrun;
  vars.erase("MASTER_PORT");
  EXPECT_NE(error_of("env://", -1, -1, vars).find("MASTER_PORT"), std::string::npos);
}

TEST(RendezvousSpec, MissingRankNamesTheVariable) {
  EXPECT_NE(error_of("env://", -1, -1, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                .find("environment variable RANK expected"),
            std::string::npos);
  EXPECT_NE(error_of("env://", -1, -1, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"RANK", "0"}})
                .find("WORLD_SIZE expected"),
            std::string::npos);
}

TEST(RendezvousSpec, MpirunVariablesAreTheFirstFallback) {
  auto spec = parse_rendezvous("tcp://h:5", -1, -1,
                               env_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                       {"OMPI_COMM_WORLD_SIZE", "8"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                       {"SLURM_PROCID", "0"},
                                       {"SLURM_NTASKS", "2"}}));
  EXPECT_EQ(spec.rank, 3);
  EXPECT_EQ(spec.world_size, 8);
  EXPECT_EQ(spec.local_rank, 1);
}

TEST(RendezvousSpec, SlurmVariablesAndNodelistGiveRankAndMasterAddr) {
  auto spec = parse_rendezvous("env://", -1, -1,
                               env_of({{"SLURM_PROCID", "5"},
                                       {"SLURM_NTASKS", "6"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_JOB_NODELIST", "gpu[07-09,12],login"},
                                       {"MASTER_PORT", "12345"}}));
  EXPECT_EQ(spec.rank, 5);
  EXPECT_EQ(spec.world_size, 6);
  EXPECT_EQ(spec.host, "gpu07");
}

TEST(RendezvousSpec, FirstSlurmHostHandlesListsAndRanges) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("node[3-5]"), "node3");
  EXPECT_EQ(first_slurm_host("node[9,3-5]"), "node9");
}

TEST(RendezvousSpec, TcpMethodParsesHostPortAndQuery) {
  auto spec = parse_rendezvous("tcp://10.0.0.1:23456?rank=1&world_size=2", -1, -1, env_of({}));
  EXPECT_EQ(spec.method, Method::kTcp);
  EXPECT_EQ(spec.host, "10.0.0.1");
  EXPECT_EQ(spec.port, 23456);
  EXPECT_EQ(spec.rank, 1);
  EXPECT_EQ(spec.world_size, 2);
  auto v6 = parse_rendezvous("tcp://[::1]:80", 0, 1, env_of({}));
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 80);
}

TEST(RendezvousSpec, FileMethodNeedsAnAbsolutePath) {
  auto spec = parse_rendezvous("file:///tmp/x/y", 0, 2, env_of({}));
  EXPECT_EQ(spec.method, Method::kFile);
  EXPECT_EQ(spec.path, "/tmp/x/y");
  EXPECT_NE(error_of("file://relative", 0, 1, {}).find("absolute path"), std::string::npos);
}

TEST(RendezvousSpec, MalformedInitMethodsQuoteTheInputAndListTheForms) {
  for (const char* bad : {"tcp://hostonly", "tcp://:29500", "tcp://h:port", "tcp://h:70000",
                          "udp://h:1", "10.0.0.1:29500", "env://h:1"}) {
    std::string error = error_of(bad, 0, 1, {});
    EXPECT_NE(error.find("ddp::init_process_group"), std::string::npos) << bad;
    EXPECT_NE(error.find(bad), std::string::npos) << bad << " -> " << error;
  }
  EXPECT_NE(error_of("udp://h:1", 0, 1, {}).find("accepted forms"), std::string::npos);
}

TEST(RendezvousSpec, RankOutsideTheWorldAndEmptyWorldsAreErrors) {
  EXPECT_NE(
      error_of("tcp://h:1", 2, 2, {}).find("rank 2 (from options) is outside [0, world_size)"),
      std::string::npos);
  EXPECT_NE(error_of("tcp://h:1", 0, 0, {}).find("world_size must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_of("tcp://h:1", -1, -1, {{"RANK", "x"}, {"WORLD_SIZE", "2"}})
                .find("RANK must be an integer, got 'x'"),
            std::string::npos);
}

TEST(RendezvousSpec, TorchrunAgentStoreIsDetected) {
  auto vars = kTorchrun;
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  vars["TORCHELASTIC_RESTART_COUNT"] = "2";
  auto spec = parse_rendezvous("env://", -1, -1, env_of(vars));
  EXPECT_TRUE(spec.use_agent_store);
  EXPECT_EQ(spec.restart_count, 2);
}

TEST(RendezvousSpec, WhatTheBackendsNeedIsReadHereWhateverTheInitMethod) {
  auto spec = parse_rendezvous("tcp://h:1", 0, 2,
                               env_of({{"TORCHELASTIC_RUN_ID", "job7"},
                                       {"TORCHELASTIC_RESTART_COUNT", "3"},
                                       {"DDP_CPP_HOST_ID", "hostB"},
                                       {"GLOO_SOCKET_IFNAME", "eth1"}}));
  EXPECT_EQ(spec.run_id, "job7");
  EXPECT_EQ(spec.restart_count, 3);
  EXPECT_EQ(spec.host_id, "hostB");
  EXPECT_EQ(spec.gloo_socket_ifname, "eth1");
  auto plain = parse_rendezvous("file:///tmp/x", 0, 1, env_of({}));
  EXPECT_EQ(plain.run_id, "job");
  EXPECT_EQ(plain.restart_count, 0);
  EXPECT_TRUE(plain.host_id.empty());
}

// A value that is set but unusable is the caller's error, of its own type, and says what it got:
// a negative RANK is not "expected, but not set".
TEST(RendezvousSpec, NegativeOrMalformedRankAndWorldSizeAreInvalidArgumentsNamingTheValue) {
  struct Case {
    std::string method;
    std::map<std::string, std::string> vars;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"tcp://h:1",
       {{"RANK", "-1"}, {"WORLD_SIZE", "2"}},
       "environment variable RANK must be a rank, 0 or more, got -1"},
      {"tcp://h:1",
       {{"RANK", "0"}, {"WORLD_SIZE", "-2"}},
       "environment variable WORLD_SIZE must be a world size, 1 or more, got -2"},
      {"tcp://h:1", {{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, "RANK must be an integer, got 'abc'"},
      {"tcp://h:1?rank=-3&world_size=4", {}, "rank in the init_method query must be a rank"},
      {"tcp://h:1",
       {{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "2"}},
       "environment variable SLURM_PROCID must be a rank, 0 or more, got -1"},
  };
  for (const auto& c : cases) {
    try {
      parse_rendezvous(c.method, -1, -1, env_of(c.vars));
      ADD_FAILURE() << c.expected << ": no error";
    } catch (const ddp::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("not set"), std::string::npos) << e.what();
      EXPECT_EQ(e.rank(), -1);
      EXPECT_EQ(e.operation(), "init_process_group");
    }
  }
}
