"""The answers of the API, one module per resource: the one definition of each answer's shape
(docs/architecture.md, "Layers").

The services build these models and return them; the routes return what the services give and declare the
same model as ``response_model``, so the OpenAPI document and the generated clients are typed from the
one definition. The package sits below the services and the API (it imports neither). Every model
forbids unknown fields: an answer with a field no model declares fails loudly in the tests instead of the
field being dropped silently. Field names are the JSON names (camelCase for the capacity API, snake_case
for the vq.* documents; docs/api.md).
"""
