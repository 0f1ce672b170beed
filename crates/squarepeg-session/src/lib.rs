//! Sans-IO session core: messages with priority, lifetime, dependency and squash; ordered streams with flow control; the late-binding send scheduler
