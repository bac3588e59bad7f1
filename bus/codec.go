package bus

import (
	"encoding/json"
	"fmt"
	"path"
	"reflect"

	"google.golang.org/protobuf/proto"
)

// Codec turns message values into bodies and back. Its content type
// travels with every message it encodes (omnibus.Message.ContentType, the
// CloudEvents datacontenttype), and a receiver decodes a body with the
// codec of that content type.
type Codec interface {
	// ContentType is the media type of what Marshal returns
	// ("application/json").
	ContentType() string
	// Marshal encodes v, a value (or a pointer to one) of a message type.
	Marshal(v any) ([]byte, error)
	// Unmarshal decodes data into v, a pointer to a new value of the
	// handler's message type (for a proto.Message type, the message).
	Unmarshal(data []byte, v any) error
}

// JSON is the default codec: encoding/json, content type
// application/json.
var JSON Codec = jsonCodec{}

// Protobuf encodes proto.Message values in the protobuf binary format,
// content type application/protobuf. It is used for every message type
// that implements proto.Message, whatever the bus's default codec.
var Protobuf Codec = protoCodec{}

type jsonCodec struct{}

func (jsonCodec) ContentType() string                { return "application/json" }
func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

type protoCodec struct{}

func (protoCodec) ContentType() string { return "application/protobuf" }

func (protoCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a proto.Message", v)
	}
	return proto.Marshal(m)
}

func (protoCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a proto.Message", v)
	}
	return proto.Unmarshal(data, m)
}

// Typer is implemented by message types that name themselves on the wire.
// Without it a type's name is its package's name and its own
// ("shop.ChargeCard"); a proto.Message's is its full protobuf name
// ("shop.v1.ChargeCard").
type Typer interface {
	MessageType() string
}

// Keyer is implemented by message types that carry their key: the
// omnibus.Message.Key that partitions and orders them (an order ID, say).
// Messages of one key are handled in order where the transport's lanes
// are ordered (see the package documentation). Without it a message has
// no key; a reply takes the key of the message it answers.
type Keyer interface {
	MessageKey() string
}

var protoMessage = reflect.TypeFor[proto.Message]()

// typeInfo is what the bus knows of a Go message type.
type typeInfo struct {
	name  string
	proto bool
}

// infoOf reads the wire name of type t (a value type or a pointer to
// one). Unnamed types (maps, slices, anonymous structs) have no name.
func infoOf(t reflect.Type) (typeInfo, error) {
	if t == nil {
		return typeInfo{}, fmt.Errorf("bus: nil message: %w", errInvalid)
	}
	if t.Implements(protoMessage) {
		v := newOf(t).(proto.Message)
		return typeInfo{name: string(proto.MessageName(v)), proto: true}, nil
	}
	if t.Implements(reflect.TypeFor[Typer]()) {
		return typeInfo{name: newOf(t).(Typer).MessageType()}, nil
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[Typer]()) {
		return typeInfo{name: reflect.New(t).Interface().(Typer).MessageType()}, nil
	}
	base := t
	if base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	if base.Name() == "" {
		return typeInfo{}, fmt.Errorf("bus: message type %s has no name (use a named type, or implement Typer): %w", t, errInvalid)
	}
	return typeInfo{name: path.Base(base.PkgPath()) + "." + base.Name()}, nil
}

// newOf returns a usable value of t: a new zero value, or for a pointer
// type a pointer to a new zero value.
func newOf(t reflect.Type) any {
	if t.Kind() == reflect.Pointer {
		return reflect.New(t.Elem()).Interface()
	}
	return reflect.Zero(t).Interface()
}
