//! Test service: fake_llm.
