//! Checks what turnstile sent the model: no request carries a tool call without its answer.
//! The fake upstream refuses such a request with a 400 as the real API does
//! (`turnstile::testkit::fake_openai::check_request`); this names the offending request when a
//! test wants to say so itself.

use serde_json::Value;
use turnstile::testkit::fake_openai::check_request;

/// Check every recorded request (`FakeOpenAi::requests()`); panics naming the request and the
/// call.
pub fn check_requests(requests: &[Value]) {
    for (i, req) in requests.iter().enumerate() {
        check_request(req).unwrap_or_else(|e| panic!("model request #{}: {e}\n{req}", i + 1));
    }
}
