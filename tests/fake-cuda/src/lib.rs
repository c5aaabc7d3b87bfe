//! Fake libcuda.so.1: see tests/fake-driver.md.
