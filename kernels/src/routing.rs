//! Routing: capability -> path and policies (SPEC sections 3 and 4).
