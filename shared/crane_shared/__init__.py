"""Code shared by the crane services: policy, annotation codec, binding-record schema and store."""
