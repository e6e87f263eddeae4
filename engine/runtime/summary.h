// Reads an event stream and prints what a person wants to know about the run:
// throughput, latency, peak memory per device and category, where time went.
#pragma once

#include <istream>
#include <ostream>
#include <string>

namespace ss {

// Returns 0; throws UsageError, naming the stream `name`, where it is not an
// event stream or a newer version than this engine reads.
int summarize_stream(std::istream& in, std::ostream& out, const std::string& name);

}  // namespace ss
