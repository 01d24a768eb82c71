//! The control protocol's request decoder on arbitrary lines: a request or an error, never a
//! panic; a request reads back the same once written (what shaperctl sends is what shaperd
//! reads). The same bytes as a rate in tc's spelling: a rate that parses reads back exactly
//! from its written form, which is how a runtime change hands it to the configuration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shaper::{api::Request, rate::Rate};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<Request>(data) {
        let text = serde_json::to_string(&request).expect("requests serialize");
        assert_eq!(serde_json::from_str::<Request>(&text).ok(), Some(request), "{text}");
    }
    if let Ok(Ok(rate)) = std::str::from_utf8(data).map(str::parse::<Rate>) {
        assert_eq!(rate.to_string().parse::<Rate>().ok(), Some(rate), "{rate}");
    }
});
