//! TODO(helper): decide
