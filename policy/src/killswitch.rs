//! TODO(helper): killswitch
