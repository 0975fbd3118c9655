//! TODO(helper): assign
