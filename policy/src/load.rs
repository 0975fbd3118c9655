//! TODO(helper): load
