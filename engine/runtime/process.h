// Starting this engine again: as a child (benchmarks, sweeps) or as MPI ranks
// under mpirun (launch, calibrate, collective benchmarks). One place for the
// executable's path and for what OpenMPI needs on this host.
#pragma once

#include <sys/types.h>

#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace ss {

// The path of the running shardscope-engine.
std::string self_exe();
// mpirun's path (found at configure time).
const char* mpirun_program();
// Whether `ranks` ranks need --oversubscribe here (more ranks than cores).
bool needs_oversubscribe(int ranks);
// What mpirun needs in its environment here: the run-as-root variables as
// root; with every rank on this host, shared memory between the ranks and,
// without ssh, an agent that is never used.
std::vector<std::pair<std::string, std::string>> mpirun_environment(bool local_only);
// A shell command running `ranks` ranks of this executable with `args`
// (already quoted), with the run-as-root variables when running as root.
std::string mpirun_self_command(int ranks, const std::string& args);
// Runs a shell command, copying its output to `out`; false when it fails.
bool stream_command(const std::string& cmd, std::ostream& out);
// The state letter of /proc/PID/stat ('R', 'S', 'T', 'Z', ...); 0 when gone.
char process_state(pid_t pid);
// Whether `pid` is a process that has not yet ended (a zombie has).
bool process_alive(pid_t pid);
// Every process below `root` (children, their children, ...), from /proc.
std::vector<pid_t> descendant_pids(pid_t root);
// Bytes as MiB with one decimal, for tables.
std::string mib(double bytes);

}  // namespace ss
