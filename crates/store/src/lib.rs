//! Durable job storage for redrive: SQLite and PostgreSQL backends with leases and fencing
