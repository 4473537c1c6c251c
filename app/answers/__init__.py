"""The API's response models, one module per resource (docs/architecture.md: every answer has a model).

Routes declare these as ``response_model``; the service functions keep answering plain dicts, which the
route's model validates and serialises, so the OpenAPI document and generated clients are typed. Every
model forbids unknown fields: a service that starts answering a field no model declares fails loudly in
the tests instead of the field being dropped silently. Field names are the JSON names (camelCase for the
capacity API, snake_case for the vq.* documents; docs/api.md).
"""
