"""Pictures, documents and voice notes people send: what is accepted, the media store,
reading documents, transcribing voice (README "Pictures, documents and voice")."""
