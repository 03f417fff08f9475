//! End-to-end tests of tollgate over real sockets; the tests live in
//! `tests/`.
