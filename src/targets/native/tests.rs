//! Tests of the native adapter.
