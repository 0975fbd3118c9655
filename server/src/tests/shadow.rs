//! The mirror service's bounds (issue 46 item 5).
