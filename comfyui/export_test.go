package comfyui

// SetProcRoot points c's process search at a fake process table.
func SetProcRoot(c *Client, root string) { c.procRoot = root }
