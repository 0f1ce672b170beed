//! The squarepeg transport API: connections, messages and streams over kernel TCP or squarepeg's userspace TCP
