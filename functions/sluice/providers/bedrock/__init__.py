"""Amazon Bedrock: batch inference (`batch`, `records`)."""
