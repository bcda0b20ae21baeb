// yamlread: read YAML streams the way kubectl does (gopkg.in/yaml.v2, YAML 1.1 rules) and print
// each file's documents as one JSON line, with every scalar's type kept: strings as JSON
// strings, booleans as JSON booleans, null as null, and other scalars as {"!!int": "1"},
// {"!!float": "0.0001"}; a non-string mapping key becomes "!!<type>:<value>".
// Built by tests/unit/goyaml.py with GO111MODULE=off against Debian's golang-gopkg-yaml.v2-dev.
//
// Usage: yamlread FILE...   (exit 1 with the parser's message when a file does not parse)
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"gopkg.in/yaml.v2"
)

func typed(value interface{}) interface{} {
	switch v := value.(type) {
	case nil, string, bool:
		return v
	case int, int64, uint64:
		return map[string]string{"!!int": fmt.Sprint(v)}
	case float64:
		return map[string]string{"!!float": fmt.Sprint(v)}
	case []interface{}:
		out := make([]interface{}, len(v))
		for i, item := range v {
			out[i] = typed(item)
		}
		return out
	case map[interface{}]interface{}:
		out := make(map[string]interface{}, len(v))
		for key, item := range v {
			name, ok := key.(string)
			if !ok {
				name = fmt.Sprintf("!!%T:%v", key, key)
			}
			out[name] = typed(item)
		}
		return out
	default:
		return map[string]string{fmt.Sprintf("!!%T", v): fmt.Sprint(v)}
	}
}

func main() {
	for _, path := range os.Args[1:] {
		text, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		decoder := yaml.NewDecoder(bytes.NewReader(text))
		documents := []interface{}{}
		for {
			var document interface{}
			err := decoder.Decode(&document)
			if err == io.EOF {
				break
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
				os.Exit(1)
			}
			documents = append(documents, typed(document))
		}
		line, err := json.Marshal(documents)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(string(line))
	}
}
