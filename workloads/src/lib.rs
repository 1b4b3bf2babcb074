//! The embedded trainer lives here (see the issue "The embedded trainer"); nothing yet.
