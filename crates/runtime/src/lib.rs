//! The redrive worker runtime: claims jobs, runs handlers, retries in process or defers, feeds breakers
