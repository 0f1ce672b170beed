//! A sans-IO TCP endpoint (RFC 9293 and companions) with the uTCP and Hollywood extensions
