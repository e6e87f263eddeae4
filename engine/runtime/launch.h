// `shardscope-engine launch`: validates a multi-device run, starts `mpirun`
// with one engine rank per device, forwards rank 0's event stream, and turns a
// rank that dies into an `error` event naming the rank and its last stderr
// lines. It never hangs on a dead rank or a stopped one (heartbeat.h) and
// exits non-zero when the run failed.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/run.h"

namespace ss {

struct LaunchOptions {
  std::string hostfile;               // passed to mpirun
  std::string events;                 // stream destination; empty = stdout
  std::vector<std::string> run_args;  // the options to give every rank's `run`
  double timeout_s = 0;               // 0 = none
  double rank_timeout_s = 30;         // a rank silent this long is hung (runtime/heartbeat.h); 0 = never
};

// Returns the exit code: the ranks' (0 ok, 2 usage, 3 oom) or 1 when a rank died.
int launch(const RunOptions& o, const LaunchOptions& l);
// The process part of launch, for runs validated by their caller: mpirun of
// `shardscope-engine SUBCOMMAND run_args... --events TMP` on `devices` ranks.
int start_ranks(int devices, const LaunchOptions& l, const std::string& subcommand);

}  // namespace ss
