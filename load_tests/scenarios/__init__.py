"""Reliability scenarios (faults, dependencies, drain, overload, hostile input, soak), each a
function that drives a real ``switchyard serve`` process and returns its figures. The tests in
tests/test_*.py run them small and assert on the figures; ``python -m load_tests.results``
runs them larger, repeatedly, and writes load_tests/RESULTS.md."""
