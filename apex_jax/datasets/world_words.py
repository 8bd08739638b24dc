"""The synthetic world's fixed vocabulary: occupations, product kinds, uses, methods of making and
event types (world.py builds entities from them; world_checks.py reads the event types), and the
generator of its invented words (`Names`: entity names, and the record words of world_records)."""

import random

OCCUPATIONS = ("painter", "farmer", "teacher", "doctor", "pilot", "baker", "singer", "writer",
               "lawyer", "engineer")
KINDS = ("tool", "boat", "lamp", "drink", "cloth", "clock", "wagon", "drum")
USES = ("cut stone", "carry grain", "light rooms", "catch fish", "measure time", "grind wheat",
        "heat water", "store oil")
METHODS = ("weaving wool", "casting iron", "carving wood", "blowing glass", "baking clay",
           "brewing leaves", "forging steel", "sewing leather")
EVENT_TYPES = ("Race", "Festival", "Match", "Fair", "Contest")

_ONSETS = "b d f g k l m n p r s t v z".split()
_VOWELS = "a e i o u".split()
_CODAS = ("", "", "n", "r", "l", "s")
_RESERVED = {w for text in OCCUPATIONS + KINDS + USES + METHODS + EVENT_TYPES
             for w in text.lower().split()}
# English words the generator can spell (two syllables of onset, vowel and optional coda): the
# record words avoid them, so that no model knows a record's meaning from its word.
ENGLISH_LIKE = frozenset("""
    babe bade bagel bake baker bale banal banner bare barrel basal base basin baton begin
    bender bevel bide bike bile binder bingo bison bite bode bogus bolder bole bolo bone boner
    bonus border bore dale dame dare date defer demon demur dental deter devil dime dinar dine
    diner dingo dinner dire dismal diva diver dole dollar dolor dome done donor dorsal dose
    dove dune fade faker fame fare fatal fate felon femur fender feral fetal fetus fever fiber
    file final finder fine finer fire five folder fossil fume funnel fuse gala gale gallon
    game gamer gamin garden gave gavel gender genus given giver gone gospel guru gusto kale
    kennel kernel kinder kite kola label lake lame lamer lane lapel laser lasso late later
    lava legal lemon lemur lender lentil lesser lesson lessor level lever libel life like lime
    line linen liner live liver lobe lode lone loner lose loser lotus love lover lulu lumen
    lunar lupus lure made make maker male mane mango manner manor mare mason master mate medal
    melon mender mental mentor menu metal meter mile mine miner minor minus mire miser mister
    modal mode model molar molder mole mope moral morsal morsel mortal motel motor mover mule
    mural murder murmur muse muster mute name nasal naval navel never nine nodal node none
    nose note nova novel pagan pager pale paler pallor pane panel paper pardon pasta pastor
    pedal penal person pester pesto petal peter pike pillar pine pipe pipes pistol poke poker
    polar pole polo pope portal pose poser puma pure radar rake raker ramen ramin rate ravel
    rebel refer regal renal render rental repel resin revel ride rider rigor ripe rise riser
    rival river robe robin role rondo rope rose rosin rotor rover rule ruler rumor rural ruse
    saber safe safer sage sake sale salmon salon salsa same sandal sane saner satin sedan
    semen sender sensor sepal seven sever side sine sinner sinus siren sister sitar site sober
    soda sofa solar solder sole solo some sonar sore sorrel sumo super sure surfer taker tale
    talon tame tamer tango taser tassel tender tenor tensor tidal tide tiger tile time timer
    tinder tinsel tire tofu toga tome tonal tone toner tonsil torso torus total tote tuba tube
    tuber tumor tuna tune tuner tunnel vale valor vandal vane vapor venal vendor verse vessel
    vibe vigor vile vine viral virus visor vital vote voter zonal zone
""".split())


class Names:
  """Invented capitalised words of two syllables, never repeated."""

  def __init__(self, rng: random.Random):
    self.rng, self.used = rng, set(_RESERVED)

  def word(self) -> str:
    while True:
      word = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) +
                     self.rng.choice(_CODAS) for _ in range(2))
      if word not in self.used:
        self.used.add(word)
        return word.capitalize()
