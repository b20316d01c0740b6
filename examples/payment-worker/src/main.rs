//! An idempotent payment worker built on redrive (filled in with the runtime).

fn main() {}
