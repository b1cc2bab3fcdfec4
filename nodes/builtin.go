package nodes

import "strings"

// builtin is a built-in style, written as a style guide that builtinFrame
// turns into a template.
type builtin struct {
	name, summary                                                string
	composition, lighting, palette, atmosphere, technical, avoid string
}

// builtins returns the built-in styles. It is a function, not a variable,
// so that nothing at package level can be changed.
func builtins() []builtin {
	return []builtin{
		{
			name:        "cinematic",
			summary:     "a still from a big-budget feature film",
			composition: "widescreen framing, rule of thirds, foreground elements for depth, a clear focal subject, a purposeful camera angle (low angle, over-the-shoulder or wide establishing shot)",
			lighting:    "motivated, high-contrast lighting: golden hour, volumetric light shafts or practical lights, a rim light separating the subject from the background",
			palette:     "graded like a feature film: teal and orange or a restrained complementary palette, deep blacks, controlled highlights",
			atmosphere:  "dramatic and story-driven, a moment from a larger narrative; haze, rain, dust or smoke where it fits",
			technical:   "shot on 35mm anamorphic lens, shallow depth of field, subtle film grain, anamorphic lens flare, highly detailed, 8k",
			avoid:       "flat lighting, snapshot framing, oversaturated colors, cartoon, illustration, amateur photo",
		},
		{
			name:        "anime",
			summary:     "a key visual from a high-budget anime film",
			composition: "dynamic key-visual framing, expressive poses, clear silhouettes, a layered background and foreground",
			lighting:    "cel-shaded lighting with crisp shadow shapes, soft bloom, glowing rim light, luminous sky gradients",
			palette:     "vibrant saturated colors, clean flat fills, pastel or vivid accents",
			atmosphere:  "emotive and energetic; cherry blossoms, light particles or drifting clouds where they fit",
			technical:   "clean line art, detailed painted background, studio-quality anime illustration, sharp focus, high resolution",
			avoid:       "photorealistic, 3d render, western cartoon, messy lines, deformed faces, extra limbs",
		},
		{
			name:        "photorealistic",
			summary:     "a photograph by a professional photographer",
			composition: "natural photographic framing, correct perspective and scale, a believable focal point",
			lighting:    "physically accurate natural or studio light, soft shadows, realistic reflections and global illumination",
			palette:     "true-to-life colors, accurate skin tones, neutral white balance",
			atmosphere:  "authentic and candid, a real moment captured",
			technical:   "full-frame DSLR, 50mm or 85mm prime lens at f/1.8, sharp focus, fine skin and material textures, RAW photo, 8k UHD",
			avoid:       "painting, illustration, cartoon, cgi, plastic skin, oversmoothed, unrealistic proportions, HDR halos",
		},
		{
			name:        "fantasy",
			summary:     "epic fantasy concept art",
			composition: "sweeping vistas or heroic framing, a strong focal subject, a sense of grand scale",
			lighting:    "magical, ethereal light: god rays, glowing runes, bioluminescence, dramatic sunset or moonlight",
			palette:     "rich jewel tones, luminous golds and deep blues, iridescent accents",
			atmosphere:  "enchanted and mythic, a world of legend; mist, floating particles, ancient ruins",
			technical:   "highly detailed digital painting, intricate ornamentation, matte painting, concept art quality, sharp focus",
			avoid:       "modern objects, mundane setting, photograph, low detail, flat colors",
		},
		{
			name:        "abstract",
			summary:     "an abstract artwork that interprets the description as form and color",
			composition: "a non-representational arrangement of shapes, lines and fields, with balance, rhythm and tension",
			lighting:    "light as a design element: gradients, glows, translucent overlapping layers",
			palette:     "a bold, deliberate palette built on harmony or contrast, large fields of color",
			atmosphere:  "evocative and emotional, suggesting rather than depicting",
			technical:   "rich textures (impasto, fluid pours, grain), crisp geometry or organic flow, gallery-quality artwork, high resolution",
			avoid:       "literal objects, realistic faces, text, photographic detail, clutter",
		},
		{
			name:        "cyberpunk",
			summary:     "a neon-lit, high-tech, low-life dystopia",
			composition: "dense vertical cityscapes, low angles up at megastructures, cluttered street-level detail, reflections on wet surfaces",
			lighting:    "neon signs, holograms and LEDs against darkness, hard rim light, light bleeding through rain and steam",
			palette:     "electric magenta, cyan and violet against deep blacks, acid-green accents",
			atmosphere:  "gritty and oppressive yet alive; rain, steam, smog, crowded streets",
			technical:   "hyperdetailed, cinematic night photography or detailed digital art, chromatic aberration, sharp focus, 8k",
			avoid:       "daylight, pastoral scenery, clean utopia, medieval, muted colors, low detail",
		},
		{
			name:        "sci-fi",
			summary:     "science-fiction concept art",
			composition: "a grand scale that dwarfs human figures, clean lines of spacecraft and architecture, strong perspective",
			lighting:    "cool artificial light, starlight and planetary glow, emissive panels, volumetric beams",
			palette:     "cool blues and whites with warm accent lights, metallic sheens",
			atmosphere:  "awe-inspiring and futuristic, a sense of exploration and advanced technology",
			technical:   "hard-surface detail, realistic materials, matte painting or octane render look, highly detailed, 8k",
			avoid:       "fantasy, magic, medieval, primitive technology, low detail, cartoon",
		},
	}
}

// style turns b into a Style with a template.
func (b builtin) style() Style {
	var t strings.Builder
	t.WriteString("Write a prompt for a text-to-image diffusion model in the {{.Style}} style: " + b.summary + ".\n\n")
	t.WriteString("Description: {{.Description}}\n")
	t.WriteString("{{- with .Emphasis}}\nEmphasize: {{.}}\n{{- end}}\n")
	t.WriteString("{{- with .Mood}}\nMood: {{.}}\n{{- end}}\n\n")
	t.WriteString("Style guide:\n")
	t.WriteString("- Composition: " + b.composition + "\n")
	t.WriteString("- Lighting: " + b.lighting + "\n")
	t.WriteString("- Color palette: " + b.palette + "\n")
	t.WriteString("- Atmosphere: " + b.atmosphere + "\n")
	t.WriteString("- Technical qualities: " + b.technical + "\n\n")
	t.WriteString("Keep the subject and every detail of the description. ")
	t.WriteString("{{if .Emphasis}}Give the emphasized element the most detail and name it early. {{end}}")
	t.WriteString("{{if .Mood}}Let the mood shape the lighting, palette and atmosphere. {{end}}")
	t.WriteString("Write one paragraph of comma-separated descriptive phrases, at most 120 words, starting with the subject. ")
	t.WriteString("Reply with the prompt only: no title, no label, no quotes, no explanation.")
	return Style{Name: b.name, Instructions: t.String(), Avoid: b.avoid}
}
