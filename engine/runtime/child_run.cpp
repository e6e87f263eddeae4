#include "runtime/child_run.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "runtime/process.h"

namespace ss {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

namespace {
template <class T>
std::string joined(const std::vector<T>& v) {
  std::string s;
  for (const T& x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}
}  // namespace

std::vector<std::string> to_arguments(const RunOptions& o) {
  std::vector<std::string> a = {"--model",    o.model,       "--backend", o.backend,
                                "--strategy", o.strategy,    "--devices", std::to_string(o.devices),
                                "--split",    o.split,       "--attention", o.attention,
                                "--dtype",    std::string(compute_dtype_name(o.dtype)),
                                "--decode",   std::to_string(o.decode),
                                "--seed",     std::to_string(o.seed),
                                "--threads",  std::to_string(o.threads)};
  for (const std::string& s : o.overrides) a.insert(a.end(), {"--set", s});
  if (o.kv_dtype) a.insert(a.end(), {"--kv-dtype", std::string(compute_dtype_name(*o.kv_dtype))});
  if (!o.mesh.empty()) a.insert(a.end(), {"--mesh", o.mesh});
  if (!o.comm_precision.empty()) a.insert(a.end(), {"--comm-precision", o.comm_precision});
  if (o.measure_sites) a.push_back("--measure-sites");
  if (o.no_cache) a.push_back("--no-cache");
  if (o.warm_start) a.push_back("--warm-start");
  if (!o.force_decode.empty()) a.insert(a.end(), {"--force-decode", joined(o.force_decode)});
  if (!o.tokens.empty()) a.insert(a.end(), {"--tokens", joined(o.tokens)});
  else a.insert(a.end(), {"--prompt-len", std::to_string(o.prompt_len)});
  if (o.window > 0) a.insert(a.end(), {"--window", std::to_string(o.window)});  // the batch follows from it
  else if (o.batch != 1) a.insert(a.end(), {"--batch", std::to_string(o.batch)});
  if (!o.sampling.greedy()) {
    char t[32];
    std::snprintf(t, sizeof t, "%.9g", double(o.sampling.temperature));
    a.insert(a.end(), {"--temperature", t, "--top-k", std::to_string(o.sampling.top_k)});
  }
  if (o.capacity > 0) a.insert(a.end(), {"--capacity", std::to_string(o.capacity)});
  if (!o.logits_out.empty()) a.insert(a.end(), {"--logits-out", o.logits_out});
  return a;
}

ChildRun run_child(RunOptions o, const std::string& base, const std::function<void(const proto::Event&)>& each) {
  const std::string npy = base + ".npy", events = base + ".jsonl", err = base + ".err";
  o.logits_out = npy;
  std::string cmd = shell_quote(self_exe()) + " launch";
  for (const std::string& a : to_arguments(o)) cmd += " " + shell_quote(a);
  cmd += " --events " + shell_quote(events) + " 2>" + shell_quote(err);
  ChildRun r;
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  proto::Reader reader;
  std::ifstream in(events);
  for (std::string line; std::getline(in, line);) {
    const auto parsed = reader.parse_line(line);
    if (!parsed.event) continue;
    if (const auto* e = std::get_if<proto::Error>(&*parsed.event)) r.error = e->message;
    if (each) each(*parsed.event);
  }
  try {
    if (r.exit_code == 0 && std::filesystem::exists(npy)) {
      r.logits = read_npy(npy);
      r.ok = true;
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  if (!r.ok && r.error.empty()) {
    std::ifstream e(err);
    std::getline(e, r.error);
    if (r.error.empty()) r.error = "exit status " + std::to_string(r.exit_code);
  }
  for (const std::string& f : {npy, events, err}) std::filesystem::remove(f);
  return r;
}

}  // namespace ss
