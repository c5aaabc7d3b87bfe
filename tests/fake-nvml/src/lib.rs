//! Fake libnvidia-ml.so.1: see tests/fake-driver.md.
