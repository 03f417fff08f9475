//! The service a layer calls: the one `poll_ready` made ready.

/// Takes the service `poll_ready` made ready out of `service`, leaving a
/// clone in its place (tower's rule: a clone is not ready until polled).
pub(crate) fn take_ready<S: Clone>(service: &mut S) -> S {
    let clone = service.clone();
    std::mem::replace(service, clone)
}
