// Reads an event stream and prints what a person wants to know about the run:
// throughput, latency, peak memory per device and category, where time went.
#pragma once

#include <istream>
#include <ostream>

namespace ss {

// Returns 0, or 2 when the stream could not be read (the reason is printed).
int summarize_stream(std::istream& in, std::ostream& out);

}  // namespace ss
