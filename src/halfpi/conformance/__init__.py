"""The conformance kit: ``halfpi conformance URL --token T`` runs the session
contract (docs/protocol.md) against a running Mind, through a fault-injecting
proxy it starts itself (docs/operations.md, "Conformance kit")."""
