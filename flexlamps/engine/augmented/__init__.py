"""The augmented face: requests that pause for tool calls, scheduled with preserve / discard / swap."""
