//! TODO(helper): validate
