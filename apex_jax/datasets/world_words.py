"""The synthetic world's fixed vocabulary: occupations, product kinds, uses, methods of making and
event types (world.py builds entities from them; world_checks.py reads the event types)."""

OCCUPATIONS = ("painter", "farmer", "teacher", "doctor", "pilot", "baker", "singer", "writer",
               "lawyer", "engineer")
KINDS = ("tool", "boat", "lamp", "drink", "cloth", "clock", "wagon", "drum")
USES = ("cut stone", "carry grain", "light rooms", "catch fish", "measure time", "grind wheat",
        "heat water", "store oil")
METHODS = ("weaving wool", "casting iron", "carving wood", "blowing glass", "baking clay",
           "brewing leaves", "forging steel", "sewing leather")
EVENT_TYPES = ("Race", "Festival", "Match", "Fair", "Contest")
