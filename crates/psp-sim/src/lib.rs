//! A payment service provider simulator with fault injection, for redrive's demo, tests and benchmarks
