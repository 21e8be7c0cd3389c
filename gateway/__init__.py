"""The request path's server: an OpenAI-compatible proxy around the controllers' admission, fairness
and routing decisions, in front of a ModelGroup's Ready leaders."""
