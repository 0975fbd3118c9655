//! The console's refusals at the HTTP level (issue 46 item 6).
