"""The OpenAI Decisions API (``POST /v1/decisions``): its request rules (``request``), its
translation onto System One (``translate``), its error shape (``errors``) and its forwarding
(``forward``)."""
