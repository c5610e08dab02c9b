"""What tests share, in one place: the one helper-module convention of ``tests/``.

- Helpers a test imports (builders, fakes, stacks of real servers, pollers, policy documents) live here, in a
  module named for its subject (``scheduler``, ``annotator``, ``fakeapi``, ``waiting``, ...); fixtures several
  directories use live here too, and each directory's ``conftest.py`` re-exports the ones it needs.
- ``conftest.py`` holds fixtures and hooks only and is never imported; a test module never imports another.
- The upstream metric names and the policy documents are ``policy`` (``UPSTREAM_METRICS``, ``policy_yaml``,
  ``fast_policy``); waiting on outside state is ``waiting.eventually``.

``tests/unit/test_test_layout.py`` keeps this.
"""
