// The target that compiles the suites' precompiled header (tests/CMakeLists.txt);
// the suites reuse it. Nothing of its own.
