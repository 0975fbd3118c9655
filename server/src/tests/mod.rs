//! Unit tests of the features (filled in by the tests of each feature).
