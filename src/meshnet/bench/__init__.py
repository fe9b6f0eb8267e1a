"""Benchmark lanes, the runner that interleaves them, the results file, the report and the gate.

``meshnet bench`` measures named lanes (whole-model llama.cpp, in-process splits, meshnet routes
over loopback, naive recompute) on one workload and writes machine-readable results;
``meshnet gate`` judges a results file against a versioned performance contract.
"""
