"""The jetstream relay: ingest a Bluesky jetstream feed into a stream and serve jetstream clients."""
