// A run of this engine started as a child: `launch` with the given options,
// its logits written to a file and read back, or `train` with its, its
// stream read for what went wrong. What sweep and verify compare runs with.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "io/npy.h"
#include "protocol/events.h"
#include "runtime/run.h"
#include "runtime/train.h"

namespace ss {

// `s` quoted for a POSIX shell.
std::string shell_quote(const std::string& s);

// The options as the command line that gives them: the inverse of the engine's
// run options parser (cli/main.cpp's add_model_options), for a run started by
// another. --prompt's text goes as the --tokens it was encoded to.
std::vector<std::string> to_arguments(const RunOptions& o);
// The same for `train` (cli/main.cpp's add_train_options).
std::vector<std::string> to_arguments(const TrainOptions& o);

// Refuses, in one line, options a child's command line cannot carry: one
// argument is at most 128 KiB on Linux (a prompt of some 20K tokens).
void check_child_arguments(const RunOptions& o);

// Where this process keeps the scratch files of the children it compares
// (streams, logits, gradients; each removed once read):
// /tmp/shardscope-<kind>-<pid>, held by a lock file for the process's life.
// The scratch a process killed outright (SIGKILL) left is removed first:
// this user's, under a lock nobody holds.
std::string scratch_base(const std::string& kind);

// The index of the largest of n values (the first of equals).
int64_t argmax_row(const float* z, int64_t n);

struct ChildRun {
  int exit_code = 0;
  bool ok = false;          // it exited 0 and wrote its logits
  std::string error;        // its error event's message, or else its first stderr line
  std::string error_code;   // that event's code (usage, oom, ...), or one from the exit code
  double seconds = 0;  // wall time, start-up included
  NpyArray logits;     // [prompt + decoded, vocab], or [batch, ..., vocab]
};

// Runs `launch` with `o` and every row's logits (files under `base`, removed
// after). `each` sees every event of its stream. The child runs in a process
// group of its own: SIGTERM or SIGINT to this process (the explorer's Stop)
// is passed on to it, waited for, and ends the run as stopped.
ChildRun run_child(RunOptions o, const std::string& base,
                   const std::function<void(const proto::Event&)>& each = {});
// Runs `train` with `o` (its stream's files under `base`, removed after);
// ok where it exited 0. What it writes (--dump-grads, --save) is the caller's.
ChildRun run_child(const TrainOptions& o, const std::string& base,
                   const std::function<void(const proto::Event&)>& each = {});

}  // namespace ss
