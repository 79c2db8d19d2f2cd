"""The model: conditional CTBNs, interventions, the indexing of states and parent
configurations, and random networks."""
